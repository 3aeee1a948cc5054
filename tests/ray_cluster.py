"""A Ray cluster of the test's own on this machine: egpo.ablation.own_cluster (the ablation's rehearsal starts its
own the same way), named here as the tests have always imported it."""

from egpo.ablation.own_cluster import (Cluster, add_node, free_ports, start_cluster, wait_for_dashboard,  # noqa: F401
                                       wait_for_nodes, wait_until_idle)

"""What egpo relies on in verl's source (egpo.compat.verl_shapes): the installed verl has it, and a verl without it
(the Runtime line's replica that builds its server class itself, a recompute that gates the entropy on
``calculate_entropy``) is refused at start-up naming the version, the method and what egpo would lose."""

import sys
import textwrap

import pytest

from conftest import VERL
from egpo.compat import verl_shapes
from egpo.compat.verl_shapes import VERL_RELIANCES, Reliance, VerlShapeError, check_verl_shapes, method_source


def test_the_installed_verl_has_every_reliance():
    assert verl_shapes.shape_problems(VERL) == []
    for reliance in VERL_RELIANCES[VERL]:
        assert reliance.reads in method_source(reliance.target), reliance.target


def test_reads_the_source_without_importing_the_engines():
    """verl's vLLM replica module imports vLLM; its source is read without importing it (or its package)."""
    before = set(sys.modules)
    source = method_source("verl.workers.rollout.vllm_rollout.vllm_async_server:vLLMReplica.launch_servers")
    assert "self.server_class" in source
    assert not {m for m in set(sys.modules) - before if m.startswith(("vllm", "verl.workers.rollout.vllm_rollout"))}


@pytest.fixture
def future_verl(tmp_path, monkeypatch):
    """A package shaped as verl's Runtime line (notes: upstream-2026-11): the replica builds its server itself, and
    an old-policy recompute that asks for entropy only when the config does."""
    package = tmp_path / "futureverl"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "replica.py").write_text(textwrap.dedent('''
        class SGLangReplica:
            async def launch_servers(self):
                server = ClassWithInitArgs(SGLangHttpServer, config=self.config)
                return server

        class Trainer:
            def _compute_old_log_prob(self, batch):
                return self.wg.compute_log_prob(batch, calculate_entropy=self.config.actor.calculate_entropy)
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    verl_shapes._module_tree.cache_clear()
    yield "futureverl.replica"
    verl_shapes._module_tree.cache_clear()


def test_a_verl_that_ignores_server_class_or_gates_the_entropy_is_refused(future_verl, monkeypatch):
    monkeypatch.setitem(VERL_RELIANCES, VERL, (
        Reliance(f"{future_verl}:SGLangReplica.launch_servers", "self.server_class", "egpo's sglang server"),
        Reliance(f"{future_verl}:Trainer._compute_old_log_prob", "calculate_entropy=True", "the old-policy entropy"),
        Reliance(f"{future_verl}:Gone.method", "x", "something"),
    ))
    with pytest.raises(VerlShapeError) as err:
        check_verl_shapes(VERL)
    text = str(err.value)
    assert f"verl {VERL}" in text
    assert f"{future_verl}:SGLangReplica.launch_servers no longer has `self.server_class` (egpo's sglang server)" in text
    assert f"{future_verl}:Trainer._compute_old_log_prob no longer has `calculate_entropy=True`" in text
    assert f"{future_verl}:Gone.method is gone" in text


def test_the_refusal_comes_before_ray(future_verl, monkeypatch, demo):
    """egpo.main's start-up pass (prepare_config) runs the check first: nothing is started."""
    from hydra import compose, initialize_config_module

    from egpo.preflight.prepare import prepare_config

    monkeypatch.setitem(VERL_RELIANCES, VERL, (
        Reliance(f"{future_verl}:SGLangReplica.launch_servers", "self.server_class", "egpo's sglang server"),))
    with initialize_config_module(config_module="egpo.config", version_base=None):
        cfg = compose("egpo_trainer", overrides=[f"actor_rollout_ref.model.path={demo / 'model'}"])
    import ray

    with pytest.raises(VerlShapeError, match="nothing was started"):
        prepare_config(cfg)
    assert not ray.is_initialized()

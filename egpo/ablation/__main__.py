from egpo.ablation.cli import main

main()

"""``python -m egpo.preflight``: a recipe plus overrides checked before any GPU work. See the package docstring.

    python -m egpo.preflight --config-path="$PWD/recipes" --config-name=qwen3_1.7b [override ...] [--print-config]

Exit status: 0 when nothing would stop the run (warnings may remain), 1 on any error. ``--print-config`` prints, after
the findings, the configuration ``python -m egpo.main`` would start, as YAML, with egpo's own settings applied.
"""

from __future__ import annotations

import argparse
import sys


def run(config_path: str | None, config_name: str, overrides: list[str],
        print_config: bool = False) -> tuple[int, list[str]]:
    from egpo.preflight.compose import compose
    from egpo.preflight.prepare import prepare

    prepared = prepare(compose(config_path, config_name, overrides), preflight="all")
    config, findings = prepared.config, prepared.findings
    errors = sum(f.level == "error" for f in findings)
    warnings = sum(f.level == "warning" for f in findings)
    lines = [f"preflight {config_name} {' '.join(overrides)}".rstrip(), *(f.line() for f in findings),
             f"{errors} error(s), {warnings} warning(s)"]
    if print_config:
        lines += ["# the configuration python -m egpo.main would start, with egpo's settings applied", config_yaml(config)]
    return (1 if errors else 0), lines


def config_yaml(config) -> str:
    """``config`` as YAML, interpolations resolved where they can be (a value still missing, ``???``, stays)."""
    from omegaconf import OmegaConf

    try:
        return OmegaConf.to_yaml(config, resolve=True)
    except Exception:  # noqa: BLE001 - an interpolation that needs a value only the run has: shown unresolved
        return OmegaConf.to_yaml(config)


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m egpo.preflight", description=__doc__.splitlines()[0],
                                     allow_abbrev=False)
    parser.add_argument("--config-path", default=None, help="a recipe folder (default: egpo's own configs)")
    parser.add_argument("--config-name", default="egpo_trainer")
    parser.add_argument("--print-config", action="store_true",
                        help="after the findings, print the configuration egpo.main would start, as YAML")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, as for python -m egpo.main")
    return parser


def main(argv: list[str] | None = None) -> None:
    from egpo.errors import EgpoError

    args = parser().parse_args(argv)
    try:
        status, lines = run(args.config_path, args.config_name, list(args.overrides), args.print_config)
    except EgpoError as err:  # a refusal before anything could be checked: one line, with its fix
        raise SystemExit(f"[egpo] preflight refused: {err}") from None
    print("\n".join(lines))
    sys.exit(status)


if __name__ == "__main__":
    main()

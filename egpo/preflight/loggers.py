"""``trainer.logger``: every backend usable before any model loads (verl builds its loggers at the start of
``fit()``, after the models and the rollout engine are up, so a missing credential costs that whole start)."""

from __future__ import annotations

import importlib.util
import netrc
import os

from egpo.preflight.findings import Finding, error, fact, warning

WANDB_HOST = "api.wandb.ai"
IMPORTS = {"wandb": "wandb", "swanlab": "swanlab", "mlflow": "mlflow", "tensorboard": "tensorboard",
           "clearml": "clearml", "trackio": "trackio"}


def wandb_credentials() -> bool:
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_MODE", "").lower() in ("offline", "disabled", "dryrun"):
        return True
    path = os.environ.get("NETRC", os.path.expanduser("~/.netrc"))
    try:
        return netrc.netrc(path).authenticators(os.environ.get("WANDB_BASE_URL", WANDB_HOST).split("//")[-1]) is not None
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False


def logger_findings(config, run=None) -> list[Finding]:
    from egpo.runs.main_dir import run_directory, trainer_loggers

    loggers = trainer_loggers(config)
    keep = [name for name in loggers if name != "wandb"] or ["console"]
    findings = []
    for name in loggers:
        module = IMPORTS.get(name)
        if module and importlib.util.find_spec(module) is None:
            findings.append(error("logger", f"trainer.logger has {name}, which is not installed: pip install {module}, "
                                            f"or trainer.logger=[{','.join(n for n in loggers if n != name)}]"))
    if "wandb" in loggers and importlib.util.find_spec("wandb") is not None and not wandb_credentials():
        findings.append(error("logger", "trainer.logger has wandb but this machine has no wandb credentials (no "
                                        "WANDB_API_KEY, no api.wandb.ai entry in ~/.netrc): run wandb login, or "
                                        f"export WANDB_MODE=offline, or trainer.logger=[{','.join(keep)}]"))
    if "file" not in loggers:
        findings.append(warning("logger", "trainer.logger has no file logger, so python -m egpo.report cannot read this "
                                          f"run; trainer.logger=[{','.join([*loggers, 'file'])}]"))
    where = run_directory(config)
    if where is not None and "file" in loggers:
        findings.append(fact("outputs", f"run directory {where}: config.yaml, metrics.jsonl (python -m egpo.report "
                                        "reads it), log.txt and the checkpoints"))
    return findings

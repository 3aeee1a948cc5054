"""Preflight: what a run will cost and whether it can run, known before any GPU work.

``python -m egpo.preflight --config-path=... --config-name=... [overrides]`` prints every finding for a recipe plus
overrides (egpo's start-up refusals, data files and prompt lengths, tokens and generations per step, validation's
share of the run, what egpo adds per GPU, on the driver and on disk at the model's real
scale, loggers, batch arithmetic, the actor entropy's precision, replica seeds, which servers a reward
model or teacher gets) and exits non-zero on an error. ``python -m egpo.main`` runs the cheap
ones (everything but tokenizing the prompts) before Ray starts and refuses a run with an error.
"""

from __future__ import annotations

from egpo.preflight.batch import batch_findings
from egpo.preflight.budget import budget_findings, planned_steps
from egpo.preflight.data import file_findings, prompt_length_findings, run_splits
from egpo.preflight.engines import engine_findings
from egpo.preflight.findings import Finding
from egpo.preflight.loggers import logger_findings
from egpo.preflight.scale import scale_findings
from egpo.preflight.stack import attention_finding, engine_installed_finding

__all__ = ["Finding", "preflight_findings", "startup_preflight"]


def preflight_findings(config, settings, tokenizer=None) -> list[Finding]:
    """Every finding for a prepared config and its ``algorithm`` settings as the pass read them
    (:mod:`egpo.preflight.prepare`); with a tokenizer also the prompt lengths (seconds per 10k prompts). Where the
    settings were refused (None), the figures that depend on them are left out, and a warning says so."""
    from egpo.preflight.findings import warning

    findings: list[Finding] = []
    rows = {"data.val_files": None}
    for split in run_splits(config):
        findings += file_findings(split)
        rows[split.key] = split.rows
        if tokenizer is not None:
            lengths, kept = prompt_length_findings(config, split, tokenizer)
            findings += lengths
            if kept is not None:
                rows[split.key] = kept
    findings += budget_findings(config, rows["data.train_files"], rows["data.val_files"])
    if settings is not None:
        findings += scale_findings(config, planned_steps(config, rows["data.train_files"])[0], settings)
    else:
        findings.append(warning("scale", "what egpo adds per GPU, on the driver and on disk, and the engines' "
                                         "findings, were not computed: fix algorithm.* first"))
    for found in (engine_installed_finding(config), attention_finding(config)):
        if found is not None:
            findings.append(found)
    from egpo.preflight.cpu_backend import leftover_finding

    leftover = leftover_finding(config)
    if leftover is not None:
        findings.append(leftover)
    findings += logger_findings(config)
    findings += batch_findings(config)
    if settings is not None:
        findings += engine_findings(config, settings)
        from egpo.preflight.temperature import temperature_finding

        findings += [found for found in (temperature_finding(config, settings),) if found is not None]
    return findings


def startup_preflight(config, settings, echo=print) -> list[Finding]:
    """At start-up: the cheap findings, their errors as one refusal (the run stops), else their warnings and facts
    printed."""
    from egpo.preflight.findings import error

    findings = preflight_findings(config, settings)
    errors = [f for f in findings if f.level == "error"]
    if errors:
        return [error("preflight", "preflight: " + "; ".join(f.text for f in errors) +
                      ". Nothing was started (python -m egpo.preflight lists every finding).")]
    for finding in findings:
        echo(f"[egpo preflight] {finding.line()}")
    return findings

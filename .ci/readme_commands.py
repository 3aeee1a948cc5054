"""README's own commands, read out of README.md for .ci/run, which runs them as written:

  python3 .ci/readme_commands.py install   the install steps of README's CPU chain (its ``python3 -m venv .venv ...``
                                           line up to the main job): a fresh ``.venv`` with nothing else in it
  python3 .ci/readme_commands.py test      README's test command (the fenced block after "The tests")

Standard library only: it runs before any environment exists. tests/test_docs.py holds that it finds the commands
README shows and that .ci/run runs what it prints.
"""

import re
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
MAIN_JOB = "python -m egpo.main"


def bash_blocks(text: str) -> list[str]:
    """Each ```bash block, continuation lines joined and comments dropped, as one string a line per command."""
    blocks = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        joined = re.sub(r"\\\n\s*", "", block)
        lines = [re.sub(r"\s+#.*$", "", line).strip() for line in joined.splitlines()]
        blocks.append("\n".join(line for line in lines if line))
    return blocks


def install_steps(text: str) -> str:
    """The chain that makes README's environment: the line that creates ``.venv``, cut before its main job."""
    (line,) = [line for block in bash_blocks(text) for line in block.splitlines()
               if line.startswith("python3 -m venv .venv ") and MAIN_JOB in line]
    steps = line[:line.index(MAIN_JOB)].rstrip()
    if not steps.endswith("&&"):
        raise SystemExit(f"README's CPU chain no longer ends its install with '&& {MAIN_JOB}': {line}")
    return steps[:-2].rstrip()


def test_command(text: str) -> str:
    """The one command of the first bash block after README's "The tests" paragraph."""
    after = text[text.index("The tests, in either stack's environment"):]
    block = bash_blocks(after)[0]
    if "\n" in block or not block.startswith("python -m pytest"):
        raise SystemExit(f"README's test block is not one pytest command: {block!r}")
    return block


def main(argv: list[str]) -> int:
    text = README.read_text()
    commands = {"install": install_steps, "test": test_command}
    if len(argv) != 1 or argv[0] not in commands:
        print(__doc__, file=sys.stderr)
        return 2
    print(commands[argv[0]](text))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

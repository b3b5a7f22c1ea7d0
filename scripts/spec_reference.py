"""Write the spec reference, docs/spec.md, from the spec's models (orchestrator.spec.reference).

    python scripts/spec_reference.py          # regenerate docs/spec.md
    python scripts/spec_reference.py --check  # exit 1 if docs/spec.md is not what it would write

Run it after changing a spec field or its description; tests/test_spec.py fails until the
committed page matches.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from orchestrator.spec.reference import spec_reference  # noqa: E402

PAGE = ROOT / "docs" / "spec.md"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check that docs/spec.md is up to date")
    args = parser.parse_args(argv)
    text = spec_reference()
    if args.check:
        if PAGE.exists() and PAGE.read_text() == text:
            return 0
        print(f"{PAGE.relative_to(ROOT)} is out of date: run python scripts/spec_reference.py", file=sys.stderr)
        return 1
    PAGE.write_text(text)
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

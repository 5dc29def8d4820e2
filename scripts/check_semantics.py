#!/usr/bin/env python3
"""Every test that docs/SEMANTICS.md names for a promise exists.

SEMANTICS names a promise's test as a file in backticks followed by test names in
backticks (`tests/s3.rs` `a_cold_chunk_read_takes_two_gets_and_a_full_pass_a_few`). This
checks that each such name (three underscores or more, so that an option or a case
named beside it is not taken for one) is a `fn` of that file, of a `*tests*.rs` file
beside it or of its submodules, and that the file exists. A stage of scripts/lint.

    scripts/check_semantics.py [docs/SEMANTICS.md]
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

FILE = re.compile(r"(tests|src|scripts|benches)/[\w/.-]+\.(rs|py)")
TEST = re.compile(r"[a-z][a-z0-9]*(_[a-z0-9]+){3,}")


def main() -> int:
    repo = Path(__file__).resolve().parent.parent
    doc = Path(sys.argv[1]) if len(sys.argv) > 1 else repo / "docs" / "SEMANTICS.md"
    wrong = []
    checked = 0
    # A table cell (or a paragraph): a file named, then the tests of it that follow.
    for cell in doc.read_text().split("|"):
        current = None
        for m in re.finditer(r"`([^`]+)`", cell):
            token = m.group(1)
            if FILE.fullmatch(token):
                current = repo / token
                continue
            if current is None or not TEST.fullmatch(token):
                continue
            checked += 1
            if not current.exists():
                wrong.append(f"{current.relative_to(repo)}: no such file (for {token})")
                continue
            text = current.read_text()
            # Its tests in a file beside it (`#[path = "x_tests.rs"]`) or in its
            # submodules (`x/*.rs`).
            for part in [*current.parent.glob(current.stem + "*tests*.rs"),
                         *(current.parent / current.stem).glob("*.rs")]:
                text += part.read_text()
            pattern = r"\bfn\s+" if current.suffix == ".rs" else r"\bdef\s+"
            if not re.search(pattern + re.escape(token) + r"\b", text):
                wrong.append(f"{current.relative_to(repo)}: no test {token}")
    for w in wrong:
        print(f"check_semantics: {doc.name}: {w}", file=sys.stderr)
    print(f"check_semantics: {checked} named tests, {len(wrong)} not found", file=sys.stderr)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())

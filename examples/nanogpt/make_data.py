"""Data for nanoGPT's own ``train.py`` without a network: ``data/shakespeare_char/input.txt`` made of the
ASCII text of this Python's standard-library sources (1,115,394 characters, tiny Shakespeare's length), then
nanoGPT's ``prepare.py``, unchanged (it downloads tiny Shakespeare only when ``input.txt`` is missing), writes
``train.bin``, ``val.bin`` and ``meta.pkl`` (a 96-character vocabulary).

    cd examples/nanogpt && python make_data.py
"""

from __future__ import annotations

import pathlib
import runpy
import sysconfig

HERE = pathlib.Path(__file__).resolve().parent
LENGTH = 1_115_394


def main() -> None:
    parts, size = [], 0
    for path in sorted(pathlib.Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        text = "".join(c for c in path.read_text(errors="ignore") if c.isascii())
        parts.append(text)
        size += len(text)
        if size > LENGTH:
            break
    (HERE / "data" / "shakespeare_char" / "input.txt").write_text("".join(parts)[:LENGTH])
    runpy.run_path(str(HERE / "data" / "shakespeare_char" / "prepare.py"), run_name="__main__")


if __name__ == "__main__":
    main()

"""`python prerelease.py DIST VERSION`: make an installed distribution read as another version, as
NGC's source builds of torch read (2.13.0a0+<hash>): its dist-info folder renamed, METADATA's
Version and RECORD's paths rewritten, the record of the file it was installed from dropped (so
that `pip freeze` writes `torch==<version>`, as NGC's constraints file has it), and the
package's version.py (`__version__`, where it has one) set and compiled. Run inside the
NGC-like test base (tests/support/ngc_base.py); standard library only."""

from __future__ import annotations

import py_compile
import re
import sys
import sysconfig
from pathlib import Path


def main(dist: str, version: str) -> None:
    site = Path(sysconfig.get_paths()["purelib"])
    (old,) = site.glob(f"{dist}-*.dist-info")
    new = old.with_name(f"{dist}-{version}.dist-info")
    metadata = old / "METADATA"
    metadata.write_text(re.sub(r"(?m)^Version: .*$", f"Version: {version}",
                               metadata.read_text(), count=1))
    (old / "direct_url.json").unlink(missing_ok=True)
    record = old / "RECORD"
    record.write_text("".join(line.replace(f"{old.name}/", f"{new.name}/")
                              for line in record.read_text().splitlines(keepends=True)
                              if not line.startswith(f"{old.name}/direct_url.json,")))
    old.rename(new)
    module = site / dist / "version.py"
    if module.is_file():
        module.write_text(re.sub(r"(?m)^__version__ = .*$", f"__version__ = {version!r}",
                                 module.read_text(), count=1))
        py_compile.compile(str(module), doraise=True)  # its cached bytecode, as pip left it


if __name__ == "__main__":
    main(*sys.argv[1:])

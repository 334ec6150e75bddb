"""`python prerelease.py DIST VERSION`: make an installed distribution read as another version, as
NGC's source builds of torch read (2.13.0a0+<hash>): its dist-info folder renamed, METADATA's
Version and RECORD's paths rewritten, and the package's version.py (`__version__`, where it has
one) set. Run inside the NGC-like test base (tests/support/ngc_base.py); standard library only."""

from __future__ import annotations

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
    record = old / "RECORD"
    record.write_text(record.read_text().replace(f"{old.name}/", f"{new.name}/"))
    old.rename(new)
    module = site / dist / "version.py"
    if module.is_file():
        module.write_text(re.sub(r"(?m)^__version__ = .*$", f"__version__ = {version!r}",
                                 module.read_text(), count=1))


if __name__ == "__main__":
    main(*sys.argv[1:])

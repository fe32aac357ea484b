"""The wheel's one build step beyond pyproject.toml: the console's browser libraries from npm.

`npm ci` (by package-lock.json) runs in a temporary folder, never in the checkout's node_modules, and
the files that the console serves as console-vendor/ are copied into the build as the console app's
static/console-vendor/, where staticfiles finds them in the installed package. An editable install
skips it: a checkout serves them from node_modules (`make assets`).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
# node_modules path -> name under console/static/console-vendor/
VENDOR_FILES = {"chart.js/dist/chart.umd.js": "chart.umd.js", "chart.js/LICENSE.md": "chart.js-LICENSE.md"}
NPM_CI = ["npm", "ci", "--omit=dev", "--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error"]


class BuildPyWithVendor(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        target = Path(self.build_lib) / "console" / "static" / "console-vendor"
        with tempfile.TemporaryDirectory(prefix="fairgate-npm-") as tmp:
            for name in ("package.json", "package-lock.json"):
                shutil.copy(HERE / name, tmp)
            try:
                subprocess.run(NPM_CI, cwd=tmp, check=True)
            except FileNotFoundError:
                raise SystemExit(
                    "building Fairgate's wheel needs npm (the console's Chart.js, by package-lock.json)"
                ) from None
            target.mkdir(parents=True, exist_ok=True)
            for source, name in VENDOR_FILES.items():
                shutil.copyfile(Path(tmp) / "node_modules" / source, target / name)


setup(cmdclass={"build_py": BuildPyWithVendor})

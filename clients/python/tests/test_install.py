"""`pip install` of this package into a virtual environment, offline, as
the README tells a Debian 12 user to: `python3 -m venv
--system-site-packages`, then `pip install --no-build-isolation --no-index`
(setuptools and wheel come from python3-setuptools and python3-wheel
through the system site packages; nothing is fetched). Then the installed
package is imported from outside the source tree. Skipped, saying why,
where python3-venv (ensurepip) or setuptools is missing."""

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _missing() -> str:
    if importlib.util.find_spec("ensurepip") is None:
        return "python3-venv is missing (no ensurepip): apt-get install python3-venv"
    for module, package in (("setuptools", "python3-setuptools"), ("wheel", "python3-wheel")):
        if importlib.util.find_spec(module) is None:
            return "%s is missing: apt-get install %s" % (module, package)
    return ""


class OfflineVenvInstall(unittest.TestCase):
    def setUp(self):
        why = _missing()
        if why:
            self.skipTest(why)

    def test_pip_install_into_a_venv_offline_and_import(self):
        with tempfile.TemporaryDirectory() as tmp:
            # A copy: an in-tree build would leave build/ and *.egg-info in
            # the source tree.
            source = os.path.join(tmp, "src")
            shutil.copytree(PACKAGE, source,
                            ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
            venv = os.path.join(tmp, "venv")
            env = {k: v for k, v in os.environ.items()
                   if k not in ("PYTHONPATH", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL")}
            env["PIP_NO_INDEX"] = "1"  # offline: fail rather than fetch
            env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
            run = lambda *args: subprocess.run(  # noqa: E731
                args, cwd=tmp, env=env, capture_output=True, text=True, timeout=240)
            made = run(sys.executable, "-m", "venv", "--system-site-packages", venv)
            if made.returncode != 0 and "ensurepip" in made.stdout + made.stderr:
                self.skipTest("python3-venv is missing: apt-get install python3-venv")
            self.assertEqual(made.returncode, 0, made.stdout + made.stderr)
            python = os.path.join(venv, "bin", "python")
            installed = run(python, "-m", "pip", "install", "--no-build-isolation", "--no-index",
                            source)
            self.assertEqual(installed.returncode, 0, installed.stdout + installed.stderr)
            probe = run(python, "-c", "\n".join([
                "import importlib.metadata as m, os, shardlock",
                "print(shardlock.__file__)",
                "print(shardlock.__version__ == m.version('shardlock'))",
                "print(m.metadata('shardlock')['License'])",
                "print(os.path.exists(os.path.join(os.path.dirname(shardlock.__file__), "
                "'py.typed')))",
                "print(shardlock.AsyncClient.__name__, shardlock.Client.__name__)",
            ]))
            self.assertEqual(probe.returncode, 0, probe.stderr)
            where, same_version, licence, typed, names = probe.stdout.splitlines()
            self.assertTrue(where.startswith(venv), where)  # not the source tree
            self.assertEqual(same_version, "True")
            self.assertEqual(licence, "MIT")
            self.assertEqual(typed, "True")
            self.assertEqual(names, "AsyncClient Client")


if __name__ == "__main__":
    unittest.main()

"""The bootstrap ``run_code`` stages next to a script and runs: ``python runner.py RUN_DIR
ENTRYPOINT SCRIPT_FILE``.

It imports SCRIPT_FILE, calls ``ENTRYPOINT(input)`` with ``RUN_DIR/input.json`` and writes the
JSON result to ``RUN_DIR/output.json``. Standard library only: it may run in a container
without this package.
"""

import importlib.machinery
import importlib.util
import json
import os
import sys

MODULE, PACKAGE = "agentenv_run_code_script", "agentenv_run_code_pkg"


def main(run_dir: str, entrypoint: str, script_file: str) -> None:
    script = os.path.join(run_dir, script_file)
    # The entry's folder first, so a nested entry imports its siblings by bare name.
    sys.path[:0] = list(dict.fromkeys([os.path.dirname(script), run_dir]))
    name = MODULE
    if os.path.dirname(script_file):
        # A nested entry belongs to a package of our own naming, so relative imports work
        # whatever its folder is called.
        package = importlib.machinery.ModuleSpec(PACKAGE, None, is_package=True)
        package.submodule_search_locations = [os.path.dirname(script)]
        sys.modules[PACKAGE] = importlib.util.module_from_spec(package)
        name = f"{PACKAGE}.{os.path.splitext(os.path.basename(script_file))[0]}"
    spec = importlib.util.spec_from_file_location(name, script)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    function = getattr(module, entrypoint, None)
    if not callable(function):
        raise SystemExit(f"{script_file} defines no {entrypoint}(input)")
    with open(os.path.join(run_dir, "input.json")) as f:
        result = function(json.load(f))
    text = json.dumps(result)  # before opening: an unserialisable result leaves no file
    with open(os.path.join(run_dir, "output.json"), "w") as f:
        f.write(text)


if __name__ == "__main__":
    main(*sys.argv[1:4])

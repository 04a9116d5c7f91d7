"""Import a script that is not a package module (a file with dashes, or outside sys.path) by its path."""

import importlib.util


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

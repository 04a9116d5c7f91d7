"""Every repository path that the README, a doc or a code comment cites exists in the repository.

Why: a comment such as "Source: <a page under docs>" reads as authoritative, and nothing else notices when
the page was never written, was renamed, or lives in notes kept beside the repository (in a shared
folder) that a user of the repo never sees.

Scanned (files from `git ls-files`, tests/fixtures/ and build/ excluded):
  README.md and every .md file under the docs folder (whole text; the folder may not exist yet);
  *.py: `#` comments and module, class and function docstrings;
  *.yml, *.yaml, *.sh: `#` comments; *.j2: `#` comments and Jinja comments;
  SOURCES.md under tests/fixtures/ (whole text): the one kind of fixture file that is prose.

A cited path is a token that starts with a top-level directory of the repository (the ones `git ls-files`
lists, plus docs and build always) followed by a slash, or a top-level file name (README.md, deploy.yml,
requirements*.txt, ...), or a bare Markdown file name (<page>.md: the page it names must be a Markdown
file of the repository, wherever it lies). Not checked: tokens with a placeholder or a glob (<name>, *,
{{ var }}, $VAR, %s), absolute paths (on the box), and paths the same file gives inside a URL (another
repository's).
A citation of a path under shared (or ../shared) always fails: it is outside the repository.

A cited path exists when (see exists()):
  git lists it as a file, or lists files under it (tracked, or new and not ignored, and on disk);
  it is under build, on disk (gitignored; scripts/bootstrap.sh builds it before the tests run);
  it is a Python module named without .py, maybe with an attribute (module_utils/spec_stats.rule);
  it is a bare Markdown file name, and some Markdown file of the repository has that name;
  it is Ansible's group_vars/<name> or host_vars/<name>, held as <name>.yml, .yaml or .json; a top-level
    group_vars citation may mean an inventory's, so any group_vars folder of the repo holding it counts;
  it is under inventory/prod, the operator's copy of inventory/example (the README's quick start): the
    same path under inventory/example exists.
"""

import ast
import functools
import io
import pathlib
import posixpath
import re
import subprocess
import tokenize
from typing import NamedTuple

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]

# Gitignored build outputs that docs and comments may cite: the path is checked on disk. Keep this short.
GENERATED_DIRS = ("build",)
# Cited even while no file holds them yet: a cited page under docs must exist.
ALWAYS_PREFIXES = ("docs", *GENERATED_DIRS)
# Paths the README tells the operator to create, as copies of tracked ones.
OPERATOR_COPIES = {"inventory/prod": "inventory/example"}
NOT_SCANNED = ("tests/fixtures/", "build/")
# Python modules cited without .py may name an attribute (module.attr), never one of these suffixes.
FILE_SUFFIXES = {"cfg", "diff", "j2", "json", "md", "py", "sh", "toml", "txt", "yaml", "yml"}
VARS_DIRS = ("group_vars", "host_vars")

PATH_CHARS = r"[A-Za-z0-9_.\-/<>*{}$%]"
PLACEHOLDER_CHARS = set("<>*{}$%")
# A token starts at a boundary: not inside a longer name, an absolute path, a URL or a home path.
BOUNDARY = r"(?<![A-Za-z0-9_.\-/~$])"
TRAILING_PUNCTUATION = ".,;:)`'\""
OUTSIDE_RE = re.compile(BOUNDARY + rf"(?:\.\./)*shared/{PATH_CHARS}+")
BARE_MARKDOWN_RE = re.compile(r"(?<![A-Za-z0-9_.\-/~$<>{}*%])[A-Za-z0-9_.\-]+\.md(?![A-Za-z0-9_.\-/])")
URL_RE = re.compile(r"https?://[^\s)>\]\"'`]+")
HASH_COMMENT_RE = re.compile(r"(?:^|\s)#(.*)$")
JINJA_COMMENT_RE = re.compile(r"\{#.*?#\}", re.DOTALL)


class Index(NamedTuple):
    files: frozenset
    dirs: frozenset

    @classmethod
    def of(cls, files):
        files = frozenset(files)
        dirs = frozenset(path[:i] for path in files for i, char in enumerate(path) if char == "/")
        return cls(files, dirs)

    def top_dirs(self):
        return frozenset({path.split("/", 1)[0] for path in self.files if "/" in path} | set(ALWAYS_PREFIXES))

    def top_files(self):
        return frozenset(path for path in self.files if "/" not in path)


def git_files():
    """Files in the work tree that git knows of: tracked, or new and not ignored (being written now).

    On a clean checkout (CI) these are exactly the tracked files. A tracked file already deleted from the
    work tree is not there any more."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    # A tracked link (playbooks/group_vars) is cited as the path it is.
    on_disk = [
        path for path in out.split("\0") if path and ((REPO / path).is_file() or (REPO / path).is_symlink())
    ]
    return sorted(set(on_disk))


@functools.cache
def repo_index():
    return Index.of(git_files())


@functools.cache
def citation_re(top_dirs, top_files):
    """The regex of one cited repository path, for these top-level names."""
    dirs = "|".join(re.escape(name) for name in sorted(top_dirs, key=len, reverse=True))
    files = "|".join(
        [re.escape(name) for name in sorted(top_files, key=len, reverse=True)]
        + [r"requirements[\w.\-]*\.txt"]
    )
    return re.compile(
        BOUNDARY + rf"(?:\./)?(?P<path>(?:{dirs})/{PATH_CHARS}*|(?:{files})(?![A-Za-z0-9_.\-/]))"
    )


def extract(text, top_dirs, top_files):
    """[(path, outside)] cited in text: outside is True for shared paths, which never exist for a user."""
    found = []
    for match in OUTSIDE_RE.finditer(text):
        found.append((match.group(0).rstrip(TRAILING_PUNCTUATION), True))
    for match in citation_re(frozenset(top_dirs), frozenset(top_files)).finditer(text):
        path = match.group("path").rstrip(TRAILING_PUNCTUATION)
        if PLACEHOLDER_CHARS.isdisjoint(path):
            found.append((path, False))
    for match in BARE_MARKDOWN_RE.finditer(text):
        if match.group(0) not in top_files:
            found.append((match.group(0), False))
    return found


def exists(path, index, on_disk=lambda path: (REPO / path).exists()):
    """Whether the cited path is in the repository (the rules in this file's docstring)."""
    path = posixpath.normpath(path)
    if path in index.files or path in index.dirs:
        return True
    if "/" not in path and path.endswith(".md"):
        return any(posixpath.basename(file) == path for file in index.files)
    top = path.split("/", 1)[0]
    if top in GENERATED_DIRS:
        return on_disk(path)
    for copy, original in OPERATOR_COPIES.items():
        if path == copy or path.startswith(copy + "/"):
            return exists(original + path[len(copy) :], index, on_disk)
    parent, name = posixpath.split(path)
    module, _, attribute = name.partition(".")
    if f"{posixpath.join(parent, module)}.py" in index.files and attribute.split(".")[0] not in FILE_SUFFIXES:
        return True
    if posixpath.basename(parent) in VARS_DIRS and "." not in name:
        # A top-level group_vars/<name> may mean an inventory's: any group_vars folder of the repo counts.
        holders = [parent] if parent != posixpath.basename(parent) else index.dirs
        for holder in holders:
            if holder == parent or holder.endswith("/" + parent):
                held = posixpath.join(holder, name)
                if held in index.dirs or any(
                    f"{held}.{ext}" in index.files for ext in ("yml", "yaml", "json")
                ):
                    return True
    return False


def python_comment_lines(source):
    """[(line number, text)]: `#` comments, and the lines of module, class and function docstrings."""
    lines = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            lines.append((token.start[0], token.string))
    source_lines = source.splitlines()
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        first = node.body[0] if node.body else None
        if (
            isinstance(first, ast.Expr)
            and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)
        ):
            for number in range(first.value.lineno, first.value.end_lineno + 1):
                lines.append((number, source_lines[number - 1]))
    return sorted(lines)


def hash_comment_lines(source):
    """[(line number, text)]: the `#` comments of a YAML file or a shell script."""
    lines = []
    for number, line in enumerate(source.splitlines(), 1):
        match = HASH_COMMENT_RE.search(line)
        if match:
            lines.append((number, match.group(1)))
    return lines


def jinja_comment_lines(source):
    """[(line number, text)]: `#` comments, and each line of the Jinja comments of a template."""
    lines = hash_comment_lines(source)
    for match in JINJA_COMMENT_RE.finditer(source):
        first = source.count("\n", 0, match.start()) + 1
        for offset, line in enumerate(match.group(0).splitlines()):
            lines.append((first + offset, line))
    return sorted(lines)


def whole_text_lines(source):
    return list(enumerate(source.splitlines(), 1))


def reader_for(path):
    """The function that gives a source file's cited-text lines, or None if the file is not scanned."""
    if path == "README.md" or (path.startswith("docs/") and path.endswith(".md")):
        return whole_text_lines
    if path.startswith("tests/fixtures/") and posixpath.basename(path) == "SOURCES.md":
        return whole_text_lines
    if path.startswith(NOT_SCANNED):
        return None
    if path.endswith(".py"):
        return python_comment_lines
    if path.endswith((".yml", ".yaml", ".sh")):
        return hash_comment_lines
    if path.endswith(".j2"):
        return jinja_comment_lines
    return None


def missing_citations(index):
    """["file:line: path"] for every cited path that is missing, or outside the repository."""
    top_dirs, top_files = index.top_dirs(), index.top_files()
    missing = []
    for source_path in sorted(index.files):
        reader = reader_for(source_path)
        if reader is None:
            continue
        text = (REPO / source_path).read_text(encoding="utf-8", errors="replace")
        urls = URL_RE.findall(text)
        for number, line in reader(text):
            for path, outside in extract(line, top_dirs, top_files):
                if outside or (not exists(path, index) and not any("/" + path in url for url in urls)):
                    missing.append(f"{source_path}:{number}: {path}")
    return missing


def test_cited_paths_exist():
    missing = missing_citations(repo_index())
    assert not missing, (
        f"{len(missing)} cited path(s) missing from the repository (one under shared is outside it: a user"
        " of the repo never sees it):\n" + "\n".join(missing)
    )


def test_build_outputs_are_gitignored():
    """The on-disk exception covers only folders that git ignores as build outputs."""
    for name in GENERATED_DIRS:
        ignored = subprocess.run(["git", "check-ignore", "-q", f"{name}/"], cwd=REPO, check=False)
        assert ignored.returncode == 0, f"{name}/ is not gitignored: cite its files as tracked ones"


TOP_DIRS = ("roles", "library", "docs", "playbooks", ".config")
TOP_FILES = ("deploy.yml", "README.md")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("see `roles/gate/tasks/main.yml`.", [("roles/gate/tasks/main.yml", False)]),
        ('Source: docs/operations.md, "NCCL on', [("docs/operations.md", False)]),
        ("[NCCL](docs/ops.md#nccl) and ./library/x.py;", [("docs/ops.md", False), ("library/x.py", False)]),
        ("base in `.config/molecule/config.yml`)", [(".config/molecule/config.yml", False)]),
        (
            "run deploy.yml, then playbooks/deploy.yml",
            [("deploy.yml", False), ("playbooks/deploy.yml", False)],
        ),
        ("pip install -r requirements-dev.txt", [("requirements-dev.txt", False)]),
        ("(vllm-eagle3.md, Metrics), SOURCES.md there", [("vllm-eagle3.md", False), ("SOURCES.md", False)]),
        (
            "notes: ../shared/docs/nccl.md, shared/docs/x.md",
            [("../shared/docs/nccl.md", True), ("shared/docs/x.md", True)],
        ),
        # Placeholders and globs, absolute paths on the box, URLs, longer names: not citations.
        ("roles/<name>/tasks/main.yml, library/*.py, roles/{{ role }}/x, roles/$ROLE, roles/%s/x", []),
        ("/opt/specfleet/roles/gate/x and ~/roles/x", []),
        ("https://github.com/o/r/blob/main/library/x.py", []),
        (
            "myroles/x, libraryx/y, sim_roles/z, deploy.yml.j2, roles/x/README.md",
            [("roles/x/README.md", False)],
        ),
    ],
)
def test_extract(text, expected):
    assert extract(text, TOP_DIRS, TOP_FILES) == expected


FAKE_INDEX = Index.of(
    [
        "roles/gate/tasks/main.yml",
        "module_utils/spec_stats.py",
        "group_vars/all.yml",
        "inventory/example/group_vars/gpu_boxes.yml",
        "tests/fixtures/drafters/SOURCES.md",
    ]
)


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("roles/gate/tasks/main.yml", True),
        ("roles/gate/", True),
        ("roles/gate/tasks/rollback.yml", False),
        ("docs/operations.md", False),
        ("module_utils/spec_stats", True),
        ("module_utils/spec_stats.rule", True),
        ("module_utils/spec_stats.md", False),
        ("group_vars/all", True),
        ("group_vars/gpu_boxes", True),
        ("group_vars/nope", False),
        ("inventory/prod", True),
        ("inventory/prod/group_vars/gpu_boxes.yml", True),
        ("inventory/prod/group_vars/other.yml", False),
        ("build/sim-models/tokenmap", True),
        ("build/sim-models/gone", False),
        ("SOURCES.md", True),
        ("vllm-eagle3.md", False),
    ],
)
def test_exists(path, expected):
    assert exists(path, FAKE_INDEX, on_disk=lambda path: path == "build/sim-models/tokenmap") == expected


def test_python_comment_lines():
    source = (
        '"""Module: docs/a.md."""\n\nX = "docs/b.md"  # docs/c.md\n\n\n'
        'def f():\n    """docs/d.md\n    docs/e.md"""\n'
    )
    cited = [
        (number, path)
        for number, line in python_comment_lines(source)
        for path, _ in extract(line, TOP_DIRS, ())
    ]
    assert cited == [(1, "docs/a.md"), (3, "docs/c.md"), (7, "docs/d.md"), (8, "docs/e.md")]

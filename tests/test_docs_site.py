"""The documentation site: built strict without importing the package or its training stack, no
Sphinx role printed literally, every cross-reference a working link, public names only in the
API reference, search served over HTTP, and the make targets that build and serve it."""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import sys
import threading
import urllib.request
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
# A role as Markdown prints it: ":class:<code>~x.Y</code>", or as written in a docstring.
LITERAL_ROLE = re.compile(
    r":(?:py:)?(?:class|func|meth|attr|mod|data|exc|obj|const|ref):(?:<code>|`)"
)
# Imported by the docs build, these would mean mkdocstrings imports the package (griffe reads
# it statically) or a framework: the docs extra has none of them.
NOT_IMPORTED = (
    "lanceloader",
    "lance",
    "torch",
    "tensorflow",
    "jax",
    "ray",
    "lightning",
    "accelerate",
    "torchdata",
    "datasets",
    "PIL",
    "grain",
    "pyarrow",
    "numpy",
)

BUILD = """\
import importlib.abc, sys
log, site, blocked = sys.argv[1], sys.argv[2], set(sys.argv[3].split(","))

class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in blocked:
            with open(log, "a") as f:
                f.write(name + "\\n")
            raise ImportError(f"the docs build imported {name}")

sys.meta_path.insert(0, Refuse())
from mkdocs.__main__ import cli
sys.argv = ["mkdocs", "build", "--strict", "--site-dir", site]
cli()
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site built as `make test` builds it (strict), with the package and the training
    stack made unimportable; fails the tests with mkdocs' output if the build does."""
    tmp = tmp_path_factory.mktemp("docs")
    log, out = tmp / "imports.log", tmp / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run(
        [sys.executable, "-c", BUILD, str(log), str(out), ",".join(NOT_IMPORTED)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    imported = log.read_text().split() if log.exists() else []
    assert imported == [], f"the docs build imported {sorted(set(imported))}"
    return out


def page_ids(page: Path) -> set[str]:
    return set(re.findall(r'\bid="([^"]+)"', page.read_text()))


def test_no_page_prints_a_sphinx_role(site: Path) -> None:
    pages = sorted(site.rglob("*.html"))
    assert len(pages) > 10
    for page in pages:
        found = LITERAL_ROLE.findall(page.read_text())
        assert not found, f"{page.relative_to(site)}: {found[:5]}"
    index = (site / "search" / "search_index.json").read_text()
    assert not LITERAL_ROLE.search(html.unescape(index))


def test_every_link_of_the_reference_resolves(site: Path) -> None:
    page = site / "reference" / "index.html"
    text = page.read_text()
    links = re.findall(r'<a class="autorefs autorefs-internal"[^>]*href="([^"]*)"', text)
    assert len(links) >= 30, links  # the roles became links
    for href in links:
        path, _, anchor = href.partition("#")
        target = (page.parent / path / "index.html").resolve() if path else page
        assert target.is_file(), href
        assert anchor in page_ids(target), href
    loader = text[text.index('id="lanceloader.Loader"') :]
    loader = loader[: loader.index('id="lanceloader.Loader.')]
    # the Loader's arguments: dataset may be a Mix (a role), cache is described by its stage
    assert 'href="#lanceloader.Mix"' in loader
    assert 'href="../architecture/#data-flows-one-way"' in loader
    # "rank, world_size: ..." in the docstring: one documented argument each
    for name in ("rank", "world_size", "device_prefetch", "device_prefetch_bytes"):
        assert f"<code>{name}</code>" in loader, name


def test_the_reference_shows_public_names_only(site: Path) -> None:
    import lanceloader

    ids = {i for i in page_ids(site / "reference" / "index.html") if i.startswith("lanceloader.")}
    public_modules = {p.stem for p in (ROOT / "src" / "lanceloader").glob("[!_]*.py")}
    for identifier in ids:
        parts = identifier.split(".")
        assert parts[1] in set(lanceloader.__all__) | public_modules, identifier
        private = [p for p in parts if p.startswith("_") and not p.endswith("__")]
        assert not private, identifier
    assert "lanceloader.materialize" in ids
    assert {"lanceloader.Loader.set_weights", "lanceloader.Loader.step"} <= ids  # from MixSteering
    assert not [i for i in ids if "write_piece" in i or ".Job" in i or "progress_path" in i]


def test_the_conversion_leaves_no_role_in_a_documented_docstring() -> None:
    griffe = pytest.importorskip("griffe")
    sys.path.insert(0, str(ROOT / "docs" / "_ext"))
    try:
        import sphinx_roles
    finally:
        sys.path.remove(str(ROOT / "docs" / "_ext"))
    extension = sphinx_roles.SphinxRoles(reference=str(ROOT / "docs" / "reference.md"))
    package = griffe.load(
        "lanceloader",
        search_paths=[str(ROOT / "src")],
        extensions=griffe.load_extensions(extension),
    )
    documented = sphinx_roles.documented_paths(
        package.modules_collection,
        sphinx_roles.reference_identifiers(ROOT / "docs" / "reference.md"),
    )
    assert "lanceloader.Loader.state_dict" in documented
    converted = 0
    for obj in sphinx_roles.walk(package):
        if obj.path in documented and obj.docstring is not None:
            assert not sphinx_roles.ROLE.search(obj.docstring.value), obj.path
            converted += obj.docstring.value.count("][")
    assert converted >= 30
    assert [u for u in extension.unresolved if u[0] in documented] == []


SMALL_PACKAGE = {
    "__init__.py": '''"""A package: :class:`~pkg.inner.Thing`, :func:`helper <pkg.inner.helper>`."""
from pkg.inner import Thing, helper
__all__ = ["Thing", "helper"]
''',
    "inner.py": '''"""Internal: :data:`LIMIT`."""
LIMIT = 600
LONG = ("a first value", "a second value", "a third value")


class Thing:
    """Reads up to :data:`LIMIT` rows; see :meth:`read`, :data:`LONG`, :mod:`pkg.inner`,
    :class:`Hidden` and :class:`Nowhere`.

    Args:
        rank, world_size: this process's place.
    """

    def read(self):
        """Read; :attr:`Thing.read` itself."""


class Hidden:
    """Not on the page."""


def helper():
    """Help."""
''',
}


def load_with_roles(tmp_path: Path) -> tuple[Any, Any, dict[str, str]]:
    griffe = pytest.importorskip("griffe")
    sys.path.insert(0, str(ROOT / "docs" / "_ext"))
    try:
        import sphinx_roles
    finally:
        sys.path.remove(str(ROOT / "docs" / "_ext"))
    for name, text in SMALL_PACKAGE.items():
        (tmp_path / "pkg").mkdir(exist_ok=True)
        (tmp_path / "pkg" / name).write_text(text)
    (tmp_path / "reference.md").write_text("::: pkg.Thing\n\n::: pkg.helper\n")
    extension = sphinx_roles.SphinxRoles(reference=str(tmp_path / "reference.md"))
    package = griffe.load(
        "pkg", search_paths=[str(tmp_path)], extensions=griffe.load_extensions(extension)
    )
    docs = {
        obj.path: obj.docstring.value
        for obj in sphinx_roles.walk(package)
        if obj.docstring is not None
    }
    return extension, package, docs


def test_roles_become_links_values_or_the_architecture_link(tmp_path: Path) -> None:
    extension, _, docs = load_with_roles(tmp_path)
    assert docs["pkg"].startswith("A package: [`Thing`][pkg.Thing], [`helper`][pkg.helper].")
    thing = docs["pkg.inner.Thing"]
    assert "Reads up to `LIMIT = 600` rows; see [`read`][pkg.Thing.read]" in thing
    assert "[`LONG`][data-flows-one-way]" in thing  # too long a value to show: the stages
    assert "[`pkg.inner`][data-flows-one-way]" in thing
    assert "[`Hidden`][data-flows-one-way]" in thing  # internal: not on the page
    assert "`Nowhere`" in thing and "[`Nowhere`]" not in thing
    assert extension.unresolved == [("pkg.inner.Thing", ":class:`Nowhere`")]
    assert "rank: this process's place." in thing and "world_size: this process's" in thing
    assert docs["pkg.inner.Thing.read"] == "Read; [`Thing.read`][pkg.Thing.read] itself."


def test_search_works_when_the_site_is_served(site: Path) -> None:
    handler = partial(SimpleHTTPRequestHandler, directory=str(site))
    handler.log_message = lambda *args: None  # type: ignore[method-assign]
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        with urllib.request.urlopen(f"{base}/", timeout=10) as response:
            assert 'data-md-component="search-query"' in response.read().decode()
        with urllib.request.urlopen(f"{base}/search/search_index.json", timeout=10) as response:
            index = json.loads(response.read())
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
    locations = {doc["location"] for doc in index["docs"]}
    assert "reference/#lanceloader.Loader" in locations
    assert "reference/#lanceloader.materialize" in locations


def make_dry_run(*targets: str) -> str:
    result = subprocess.run(
        ["make", "-n", "-B", *targets], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_make_docs_installs_the_docs_extra_only_and_docs_serve_serves() -> None:
    docs = make_dry_run("docs")
    assert "-e '.[docs]'" in docs and "dev" not in docs and "torch" not in docs
    assert "mkdocs build" in docs
    assert "mkdocs serve" in make_dry_run("docs-serve")
    assert "mkdocs build" in make_dry_run("test")  # make test still builds the site
    readme = (ROOT / "README.md").read_text()
    assert "make docs-serve" in readme and "python -m http.server -d site" in readme

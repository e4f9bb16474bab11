"""A Griffe extension for the API reference (mkdocs.yml): the docstrings' Sphinx roles become
links, and Google-style arguments documented together (``rank, world_size: ...``) one entry each.

The docstrings are written for Sphinx-style readers and doctest: ``:class:`~lanceloader.Mix```,
``:func:`convert```, ``:meth:`Pipeline.assemble```, ``:data:`LOCK_WAIT_S```, ``:mod:`...```,
``:attr:`title <target>```. Markdown prints those literally. Once the whole package is loaded,
each role is resolved as Python would resolve the name where the docstring is (the object, its
class, its module, then the package), and becomes:

* a cross-reference (``[`Mix`][lanceloader.Mix]``) when the reference page documents the target
  (``docs/reference.md``'s ``:::`` lines and their public, documented members, as mkdocstrings
  shows them with ``filters: public``); mkdocs' strict build fails if such a link is broken;
* for a constant of an internal module, its value (``LOCK_WAIT_S = 600``);
* for any other internal name, a link to the architecture page's table of stages, which says
  what each module does (the reference shows public names only).

A role that names nothing is left as code and logged as a warning (strict builds fail on it)
when its docstring is on the reference page.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import griffe

logger = griffe.logger

# :role:`target`, :role:`~target`, :role:`title <target>`, :py:role:`...`
ROLE = re.compile(r":(?:py:)?(class|func|meth|attr|mod|data|exc|obj|const|ref|type):`([^`]+)`")
# A Google-style argument line documenting several names: "    a, b: text" or "    a, b (int): text"
SHARED_ARGUMENT = re.compile(r"^(\s+)(\w+(?:\s*,\s*\w+)+)(\s*(?:\([^)]*\))?:\s.*)$")
ARGUMENT_SECTIONS = (
    "args:",
    "arguments:",
    "parameters:",
    "params:",
    "keyword args:",
    "keyword arguments:",
    "other parameters:",
)
# The longest constant value shown in place of a role, in characters.
VALUE_SHOWN_CHARS = 40

Resolver = Callable[[str, str], str]


def convert_roles(text: str, render: Resolver) -> str:
    """``text`` with each Sphinx role replaced by ``render(role, target)``'s Markdown; the
    roles inside fenced code blocks are left alone.

    >>> convert_roles("a :class:`~x.Mix` and :attr:`w <x.Mix.w>`", lambda r, t: f"<{r} {t}>")
    'a <class ~x.Mix> and <attr w <x.Mix.w>>'
    """
    out, fenced = [], False
    for line in text.splitlines(keepends=True):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        out.append(line if fenced else ROLE.sub(lambda m: render(m[1], m[2]), line))
    return "".join(out)


def split_shared_arguments(text: str) -> str:
    r"""Each argument line of an ``Args:`` section that documents several names at once
    (``rank, world_size: ...``) as one entry per name, the text repeated: Griffe's Google
    parser reads one name per entry.

    >>> print(split_shared_arguments("Args:\n    a, b: the two.\n        More.\n    c: one."))
    Args:
        a: the two.
            More.
        b: the two.
            More.
        c: one.
    """
    lines, out, i, in_args = text.splitlines(), [], 0, False
    while i < len(lines):
        line = lines[i]
        if line.strip().lower() in ARGUMENT_SECTIONS:
            in_args = True
        elif line.strip() and not line.startswith((" ", "\t")):
            in_args = False
        match = SHARED_ARGUMENT.match(line) if in_args else None
        if match is None:
            out.append(line)
            i += 1
            continue
        indent, names, rest = match.groups()
        body = []
        i += 1
        while i < len(lines) and (
            not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > len(indent)
        ):
            body.append(lines[i])
            i += 1
        for name in (n.strip() for n in names.split(",")):
            out += [f"{indent}{name}{rest}", *body]
    return "\n".join(out)


def reference_identifiers(page: Path) -> list[str]:
    """The ``::: identifier`` lines of a Markdown page, in order."""
    return re.findall(r"^:::\s+(\S+)", page.read_text(), flags=re.MULTILINE)


def target_of(obj: griffe.Object | griffe.Alias) -> griffe.Object | griffe.Alias:
    """The object an alias stands for (itself when it is none, or when it cannot be resolved)."""
    try:
        return obj.final_target if obj.is_alias else obj
    except (griffe.AliasResolutionError, griffe.CyclicAliasError):
        return obj


def shown_members(obj: griffe.Object | griffe.Alias) -> Iterator[tuple[str, Any]]:
    """The members mkdocstrings shows under ``obj`` (``filters: public``, no inherited
    members, no undocumented ones, no submodules)."""
    for name, member in target_of(obj).members.items():
        try:
            if member.inherited or not member.is_public or not member.has_docstrings:
                continue
            if target_of(member).is_module:
                continue
        except (griffe.AliasResolutionError, griffe.CyclicAliasError):
            continue
        yield name, member


def documented_paths(collection: Any, identifiers: list[str]) -> dict[str, str]:
    """Every path under which an object is documented on the reference page (the identifier
    itself and its canonical path), mapped to the identifier its heading has."""
    paths: dict[str, str] = {}

    def add(shown: str, obj: Any) -> None:
        for path in (shown, target_of(obj).path):
            paths.setdefault(path, shown)
        for name, member in shown_members(obj):
            add(f"{shown}.{name}", member)

    for identifier in identifiers:
        try:
            add(identifier, collection[identifier])
        except (KeyError, griffe.AliasResolutionError):
            logger.warning("reference page: no object %s", identifier)
    return paths


class SphinxRoles(griffe.Extension):
    """Turn the Sphinx roles of every docstring of a package into links (module text).

    Options (mkdocs.yml): ``reference``, the page whose ``:::`` lines say what is documented
    (default ``reference.md`` beside this folder); ``internals``, the link target of internal
    names (default the architecture page's ``data-flows-one-way`` heading).
    """

    def __init__(self, reference: str | None = None, internals: str = "data-flows-one-way") -> None:
        super().__init__()
        self.reference = Path(reference or Path(__file__).resolve().parents[1] / "reference.md")
        self.internals = internals
        self.unresolved: list[tuple[str, str]] = []

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        identifiers = [
            i for i in reference_identifiers(self.reference) if i.split(".")[0] == pkg.name
        ]
        documented = documented_paths(loader.modules_collection, identifiers)
        named = index_by_name(pkg)
        for obj in walk(pkg):
            if obj.docstring is None:
                continue
            on_page = obj.path in documented
            text = split_shared_arguments(obj.docstring.value) if on_page else obj.docstring.value
            render = RoleRenderer(obj, pkg, documented, named, self.internals)
            obj.docstring.value = convert_roles(text, render)
            for role, target in render.unresolved:
                self.unresolved.append((obj.path, f":{role}:`{target}`"))
                if on_page:
                    logger.warning("%s: the role :%s:`%s` names nothing", obj.path, role, target)


def walk(obj: griffe.Object) -> Iterator[griffe.Object]:
    """``obj`` and every object defined in it, aliases left out (their target is walked)."""
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from walk(member)


def index_by_name(pkg: griffe.Module) -> dict[str, list[griffe.Object]]:
    """Every object of the package by its short name, for roles that name an object the
    docstring's module does not import."""
    index: dict[str, list[griffe.Object]] = {}
    for obj in walk(pkg):
        index.setdefault(obj.name, []).append(obj)
    return index


class RoleRenderer:
    """The Markdown for one role found in ``obj``'s docstring (see the module text)."""

    def __init__(
        self,
        obj: griffe.Object,
        pkg: griffe.Module,
        documented: dict[str, str],
        named: dict[str, list[griffe.Object]],
        internals: str,
    ) -> None:
        self.obj, self.pkg, self.documented = obj, pkg, documented
        self.named, self.internals = named, internals
        self.unresolved: list[tuple[str, str]] = []

    def __call__(self, role: str, target: str) -> str:
        title, target = parse_role_target(target)
        found = self.find(target)
        if found is None:
            self.unresolved.append((role, target if title == target else f"{title} <{target}>"))
            return f"`{title}`"
        path = target_of(found).path
        shown = self.documented.get(path) or self.documented.get(found.path)
        if shown is not None:
            return f"[`{title}`][{shown}]"
        value = getattr(target_of(found), "value", None)
        if (
            target_of(found).is_attribute
            and value is not None
            and len(str(value)) <= VALUE_SHOWN_CHARS
        ):
            return f"`{title} = {value}`"
        return f"[`{title}`][{self.internals}]"

    def find(self, target: str) -> Any:
        """The object ``target`` names where the docstring is: in the object, then each scope
        around it, then the package's own namespace, a full path, or a unique short name."""
        parts = target.lstrip(".").split(".")
        scope: Any = self.obj if self.obj.is_class or self.obj.is_module else self.obj.parent
        while scope is not None:
            if parts[0] in target_of(scope).members:
                return member_at(target_of(scope).members[parts[0]], parts[1:])
            scope = scope.parent
        if parts[0] == self.pkg.name:
            return member_at(self.pkg, parts[1:])
        candidates = self.named.get(parts[0], [])
        if len(candidates) == 1:
            return member_at(candidates[0], parts[1:])
        return None


def parse_role_target(text: str) -> tuple[str, str]:
    """The title and target of a role's text: ``~a.B`` shows ``B``, ``title <a.B>`` shows
    ``title``, anything else shows itself.

    >>> parse_role_target("~lanceloader.Mix"), parse_role_target("w <lanceloader.Mix.w>")
    (('Mix', 'lanceloader.Mix'), ('w', 'lanceloader.Mix.w'))
    """
    match = re.fullmatch(r"\s*(.*?)\s*<([^>]+)>\s*", text)
    if match:
        return match[1], match[2].strip()
    target = text.strip()
    if target.startswith("~"):
        target = target[1:]
        return target.split(".")[-1], target
    return target, target


def member_at(obj: Any, parts: list[str]) -> Any:
    """The member of ``obj`` at the dotted ``parts``, or None."""
    for part in parts:
        members = target_of(obj).members
        if part not in members:
            return None
        obj = members[part]
    return obj

"""Reading what a user hands fleetctl (baseline, config file, inventory, and every other file a flag or config key
names: headers, a CA, keys, signatures) in bounded time and memory.

Every input file is read the same way (read_regular): stat()ed first and refused unless it is a regular file (a
FIFO, a device, a directory or a socket would block or never end), opened without blocking, and refused past its
limit (MAX_DOCUMENT_BYTES for a baseline or a config file, MAX_BYTES for each file of an inventory, the caller's
for the others); a file a library opens itself is checked by the same rules first (check_regular). YAML is parsed with
a guard on the parser's event stream: nesting deeper than MAX_DEPTH (the C composer would overflow the stack, the
Python one the recursion limit) and aliases that expand to more than MAX_ALIAS_NODES nodes (the billion laughs)
are refused while parsing, before anything is built. An inventory is checked whole before Ansible reads it (every
file it would read; groups nested more than MAX_GROUP_DEPTH deep). Each refusal is one InputError line naming the
file. What a host returns is held to bounds of the same kind (`result_problem`).
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
from types import SimpleNamespace
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml
from yaml.composer import Composer
from yaml.constructor import ConstructorError, SafeConstructor
from yaml.events import (AliasEvent, DocumentStartEvent, MappingEndEvent, MappingStartEvent, ScalarEvent,
                         SequenceEndEvent, SequenceStartEvent)
from yaml.nodes import MappingNode, ScalarNode
from yaml.resolver import Resolver

from .errors import InputError
from .sanitize import MAX_SHOWN, shortened

MiB = 1024 * 1024
MAX_BYTES = 4 * MiB  # one file of an inventory
MAX_DOCUMENT_BYTES = 1 * MiB  # a baseline, a config file (real ones: a few KiB)
MAX_DEPTH = 64  # nested collections in a YAML document (real ones: under 10)
MAX_ALIAS_NODES = 100_000  # nodes the document's aliases stand for, expanded
MAX_ITEMS = 1000  # items of one list in a baseline or config file (real ones: tens)
MAX_FILES = 20_000  # files of an inventory directory (host_vars and group_vars included)


def shown(path: object) -> str:
    """PATH for a one-line message: a 5000-character path is shortened (its start and its end are kept)."""
    return shortened(str(path))


def kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "a special file"


def size(limit: int) -> str:
    return f"{limit // MiB} MiB" if limit % MiB == 0 else f"{limit} bytes"


def is_devnull(st: os.stat_result) -> bool:
    null = os.stat(os.devnull)
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == null.st_rdev


def read_regular(path: str | Path, label: str, limit: int = MAX_BYTES, devnull_is_empty: bool = False) -> bytes:
    """The bytes of the regular file at PATH, at most LIMIT of them; anything else is one InputError line
    "PATH: cannot read LABEL: why". DEVNULL_IS_EMPTY: /dev/null reads as an empty file (FLEETCTL_CONFIG=/dev/null)."""
    refuse = refusal(path, label)

    def check(st: os.stat_result) -> bool:
        """True for /dev/null where it stands for an empty file."""
        if devnull_is_empty and is_devnull(st):
            return True
        why = not_readable(st, limit)
        if why:
            raise refuse(why)
        return False

    try:
        if check(os.stat(path)):  # nothing but a regular file is even opened (opening a device may do something)
            return b""
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as e:
        raise refuse(e.strerror or type(e).__name__) from None
    except ValueError:  # a NUL in a path a config file gave ("a\0b")
        raise refuse("a file name cannot hold a NUL character") from None
    try:
        if check(os.fstat(fd)):  # what was opened, should the path have changed since
            return b""
        chunks, read = [], 0
        while chunk := os.read(fd, min(MiB, limit + 1 - read)):  # a file that grows, or /proc's size 0
            chunks.append(chunk)
            read += len(chunk)
            if read > limit:
                raise refuse(f"larger than {size(limit)}")
        return b"".join(chunks)
    except OSError as e:
        raise refuse(e.strerror or type(e).__name__) from None
    finally:
        os.close(fd)


def check_regular(path: str | Path, label: str, limit: int = MAX_BYTES) -> None:
    """What read_regular refuses, refused without reading: for a file a library opens itself (OpenSSL reads
    $SSL_CERT_FILE), which would block on a FIFO or read a device for ever."""
    try:
        why = not_readable(os.stat(path), limit)
    except OSError as e:
        why = e.strerror or type(e).__name__
    except ValueError:
        why = "a file name cannot hold a NUL character"
    if why:
        raise refusal(path, label)(why)


def not_readable(st: os.stat_result, limit: int) -> str | None:
    """Why a file of status ST is not read (not a regular file, larger than LIMIT), None if it is."""
    if not stat.S_ISREG(st.st_mode):
        return f"{kind(st.st_mode)}, not a regular file"
    return f"larger than {size(limit)}" if st.st_size > limit else None


def refusal(path: object, label: str) -> Callable[[str], InputError]:
    """The InputError "PATH: cannot read LABEL: why" for a reason WHY."""
    return lambda why: InputError(f"{shown(path)}: cannot read {label}: {why}")


# ---- YAML ----------------------------------------------------------------------------------------------------------

class YamlGuard:
    """Fed each event of a YAML stream, in order: refuses (InputError) nesting deeper than MAX_DEPTH, aliases that
    expand to more than MAX_ALIAS_NODES nodes in all, and an alias inside the node it names (a document that
    contains itself). Each node's expanded size is counted once, when it ends: bounded time, whatever the aliases."""

    def __init__(self, path: object, max_items: int | None = None):
        self.where = shown(path)
        self.max_items = max_items  # items in one list (jsonschema's uniqueItems can be quadratic in them)
        self.open: list[list[Any]] = []  # [anchor, nodes so far, items or None for a mapping] of each open collection
        self.sizes: dict[str, int | None] = {}  # anchor -> expanded node count (None: its node is still open)
        self.expanded = 0

    def refuse(self, event: Any, why: str) -> InputError:
        mark = event.start_mark
        where = f" line {mark.line + 1} column {mark.column + 1}:" if mark else ""
        return InputError(f"{self.where}:{where} {why}")

    def see(self, event: Any) -> None:
        if isinstance(event, DocumentStartEvent):
            self.sizes = {}  # anchors are per document
        elif isinstance(event, (SequenceStartEvent, MappingStartEvent)):
            if len(self.open) >= MAX_DEPTH:
                raise self.refuse(event, f"YAML nested more than {MAX_DEPTH} levels deep")
            if event.anchor is not None:
                self.sizes[event.anchor] = None
            self.open.append([event.anchor, 1, 0 if isinstance(event, SequenceStartEvent) else None])
        elif isinstance(event, (SequenceEndEvent, MappingEndEvent)):
            anchor, size, _ = self.open.pop()
            self.add(event, size, anchor)
        elif isinstance(event, ScalarEvent):
            self.add(event, 1, event.anchor)
        elif isinstance(event, AliasEvent) and event.anchor in self.sizes:  # an unknown one: the parser says so
            size = self.sizes[event.anchor]
            if size is None:
                raise self.refuse(event, f"the YAML alias *{event.anchor} is inside the node it names "
                                         "(a document that contains itself)")
            self.expanded += size
            if self.expanded > MAX_ALIAS_NODES:
                raise self.refuse(event, f"too many YAML aliases (they expand to more than {MAX_ALIAS_NODES} nodes)")
            self.add(event, size, None)

    def add(self, event: Any, size: int, anchor: str | None) -> None:
        """A node of SIZE nodes (expanded) ended: it counts in its parent's size."""
        if anchor is not None:
            self.sizes[anchor] = size
        if self.open:
            parent = self.open[-1]
            parent[1] += size
            if parent[2] is not None:
                parent[2] += 1
                if self.max_items is not None and parent[2] > self.max_items:
                    raise self.refuse(event, f"a YAML list of more than {self.max_items} items")


if getattr(yaml, "__with_libyaml__", False):
    from yaml.cyaml import CParser as _Events  # libyaml's scanner and parser: iterative, and 4 times as fast
else:  # pragma: no cover - PyYAML built without libyaml
    from yaml.parser import Parser
    from yaml.reader import Reader
    from yaml.scanner import Scanner

    class _Events(Reader, Scanner, Parser):  # type: ignore[no-redef]
        def __init__(self, stream: Any):
            Reader.__init__(self, stream)
            Scanner.__init__(self)
            Parser.__init__(self)


class GuardedSafeLoader(Composer, _Events, SafeConstructor, Resolver):
    """What yaml.safe_load uses, but composed in Python (the C composer recurses on the C stack: a segfault) from
    events that each pass through a YamlGuard first. Integers past Python's digit limit are a YAML error."""

    def __init__(self, stream: Any, path: object, max_items: int | None = None):
        _Events.__init__(self, stream)
        Composer.__init__(self)
        SafeConstructor.__init__(self)
        Resolver.__init__(self)
        self.guard = YamlGuard(path, max_items)

    def get_event(self) -> Any:
        event = super().get_event()
        self.guard.see(event)
        return event

    def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
        """A mapping that names a key twice is a YAML error (PyYAML would keep the last silently: a baseline's first
        setting of a key lost without a word). A merge (<<) may still override what it brings."""
        if isinstance(node, MappingNode):
            seen: dict[Any, Any] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, ScalarNode):
                    continue
                key = self.construct_object(key_node)
                if key in seen:
                    raise ConstructorError("while reading a mapping", node.start_mark,
                                           f"key {key_node.value!r} given twice (first on line "
                                           f"{seen[key].start_mark.line + 1})", key_node.start_mark)
                seen[key] = key_node
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: Any) -> int:
        try:
            return super().construct_yaml_int(node)
        except ValueError as e:
            raise ConstructorError(None, None, f"cannot read the integer: {e}".split(";")[0], node.start_mark) from None


GuardedSafeLoader.add_constructor("tag:yaml.org,2002:int", GuardedSafeLoader.construct_yaml_int)


def load_yaml(raw: bytes, path: object, max_items: int | None = MAX_ITEMS) -> Any:
    """yaml.safe_load of RAW (the file at PATH) under the YamlGuard: raises yaml.YAMLError or InputError."""
    loader = GuardedSafeLoader(raw, path, max_items)
    try:
        return loader.get_single_data()
    except (ValueError, OverflowError) as e:  # a value YAML reads but Python cannot hold: 2024-13-01
        raise ConstructorError(None, None, str(e).split(";")[0], None) from None
    except yaml.YAMLError as e:
        raise too_deep(e, loader.guard) or e
    finally:
        loader.dispose()


def too_deep(error: yaml.YAMLError, guard: YamlGuard) -> InputError | None:
    """PyYAML 6.0.4's own depth limit (its scanner reads ahead, so it may stop before the guard has seen MAX_DEPTH
    levels): the guard's verdict, in the guard's words; None for any other YAML error."""
    if "maximum nesting depth" not in str(error):
        return None
    return guard.refuse(SimpleNamespace(start_mark=getattr(error, "problem_mark", None)),
                        f"YAML nested more than {MAX_DEPTH} levels deep")


def check_yaml(raw: bytes, path: object) -> None:
    """RAW's events, as the parser Ansible uses reads them (libyaml's, without building anything), through a
    YamlGuard. A file that is not YAML is left to its reader (an INI inventory is not): only the guard refuses."""
    loader_class = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    guard = YamlGuard(path)
    try:
        for event in yaml.parse(raw, Loader=loader_class):
            guard.see(event)
    except yaml.YAMLError as e:
        deep = too_deep(e, guard)
        if deep:
            raise deep from None


# ---- inventories: every file Ansible will read ----------------------------------------------------------------------

VARS_DIRS = ("group_vars", "host_vars")
MAX_DIR_DEPTH = 16
MAX_GROUP_DEPTH = 64  # groups of an inventory, children of children... (real ones: under 10)


def walk(directory: Path, wanted: Callable[[str], bool], count: list[int], source: str,
         depth: int = 0) -> Iterator[Path]:
    """The files under DIRECTORY whose names WANTED keeps (directories too: walked), sorted; at most MAX_FILES in all
    (COUNT: how many so far), in directories at most MAX_DIR_DEPTH deep (a link to a parent is a loop)."""
    if depth > MAX_DIR_DEPTH:
        raise InputError(f"{shown(directory)}: cannot read the inventory: directories nested more than "
                         f"{MAX_DIR_DEPTH} deep")
    try:
        names = sorted(os.listdir(directory))
    except OSError as e:
        raise InputError(f"{shown(directory)}: cannot read the inventory: {e.strerror}") from None
    for name in names:
        if not wanted(name):
            continue
        count[0] += 1
        if count[0] > MAX_FILES:
            raise InputError(f"{shown(source)}: cannot read the inventory: more than {MAX_FILES} files")
        path = directory / name
        try:
            is_dir = stat.S_ISDIR(os.stat(path).st_mode)
        except OSError:
            is_dir = False  # a broken link: read_regular says why
        if is_dir:
            yield from walk(path, wanted, count, source, depth + 1)
        else:
            yield path


def inventory_files(source: str, ignored: Callable[[str], bool]) -> Iterator[tuple[Path, bool]]:
    """(path, whether it is a vars file) of the files Ansible reads for the inventory at SOURCE (a file or a
    directory; IGNORED: the names it skips in one), then of those in the group_vars/ and host_vars/ beside it (or in
    it) that ansible-playbook reads too."""
    path = Path(source)
    count = [0]
    if stat.S_ISDIR(os.stat(path).st_mode):
        yield from ((p, False) for p in walk(path, lambda name: not ignored(name), count, source))
        base = path
    else:
        yield path, False
        base = path.parent
    for name in VARS_DIRS:
        if (base / name).is_dir():
            yield from ((p, True) for p in walk(base / name, lambda n: not n.startswith(".") and not ignored(n),
                                                 count, source))


class AnyTags(SafeConstructor):
    """Data whatever its tags (!vault, !unsafe: Ansible's): of an inventory, only the groups are looked at."""

    def construct_any(self, node: Any) -> Any:
        if isinstance(node, yaml.MappingNode):
            return self.construct_mapping(node)
        if isinstance(node, yaml.SequenceNode):
            return self.construct_sequence(node)
        return self.construct_scalar(node)


AnyTags.add_constructor(None, AnyTags.construct_any)


class InventoryLoader(_Events, AnyTags, Resolver):
    """A YAML inventory check_yaml passed (no deeper than MAX_DEPTH, aliases within the budget): libyaml's own
    composer is then safe, and three times as fast as the guarded one."""

    def __init__(self, stream: Any):
        _Events.__init__(self, stream)
        if not hasattr(self, "get_single_node"):  # pragma: no cover - the pure-Python parser has no composer
            Composer.__init__(self)
        AnyTags.__init__(self)
        Resolver.__init__(self)


if not hasattr(_Events, "get_single_node"):  # pragma: no cover
    class InventoryLoader(Composer, InventoryLoader):  # type: ignore[no-redef]
        pass


# Ansible's INI inventory: [group] or [group:children] (or :vars) headers, a child group's name on each line
INI_SECTION = re.compile(r"^\[([^:\]\s]+)(?::(\w+))?\]\s*(?:#.*)?$")
INI_GROUP = re.compile(r"^([^:\]\s]+)\s*(?:#.*)?$")


def ini_group_edges(text: str) -> Iterator[tuple[str, str]]:
    """(parent, child) of each [parent:children] entry of an INI inventory."""
    group, state = "ungrouped", "hosts"
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        if section := INI_SECTION.match(line):
            group, state = section.group(1), section.group(2) or "hosts"
        elif state == "children" and (child := INI_GROUP.match(line)):
            yield group, child.group(1)


def yaml_group_edges(doc: Any) -> Iterator[tuple[str, str]]:
    """(parent, child) of each `children:` entry of a YAML inventory (top-level keys: groups). A group's body that
    aliases make appear in many places is walked once per group name."""
    if not isinstance(doc, dict):
        return
    todo, done = list(doc.items()), set()
    while todo:
        name, body = todo.pop()
        if not isinstance(body, dict) or (str(name), id(body)) in done:
            continue
        done.add((str(name), id(body)))
        children = body.get("children")
        if isinstance(children, str):
            children = {children: None}
        if isinstance(children, dict):
            for child, child_body in children.items():
                yield str(name), str(child)
                todo.append((child, child_body))


def group_depth_problem(edges: Iterator[tuple[str, str]]) -> str | None:
    """Groups nested more than MAX_GROUP_DEPTH deep (Ansible's time grows with the cube of the depth: minutes for a
    few thousand), as a message, or None. Iterative; a loop is left to Ansible, which refuses it."""
    children: dict[str, list[str]] = {}
    for parent, child in edges:
        children.setdefault(parent, []).append(child)
    height: dict[str, int] = {}  # the longest chain of children below a group
    for root in children:
        if root in height:
            continue
        path, on_path = [(root, iter(children[root]))], {root}
        while path:
            group, below = path[-1]
            child = next(below, None)
            if child is None:
                path.pop()
                on_path.discard(group)
                height[group] = max((height[c] + 1 for c in children.get(group, ()) if c in height), default=0)
                if height[group] > MAX_GROUP_DEPTH:
                    return f"groups nested more than {MAX_GROUP_DEPTH} deep (below group {group[:60]!r})"
            elif child not in height and child not in on_path:
                if len(path) > MAX_GROUP_DEPTH:  # the path down to CHILD: len(path) groups below ROOT
                    return f"groups nested more than {MAX_GROUP_DEPTH} deep (below group {root[:60]!r})"
                path.append((child, iter(children.get(child, ()))))
                on_path.add(child)
    return None


def check_inventory(source: str, ignored: Callable[[str], bool]) -> None:
    """Refuse (one InputError line) an inventory Ansible cannot read in bounded time and memory: a missing one, a
    path too long, files that are not regular or are too large, YAML (what Ansible may read as YAML) too deep or
    full of aliases, groups nested too deep (an INI or a YAML inventory, its files taken together)."""
    try:
        os.stat(source)
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
            raise InputError(f"{shown(source)}: inventory not found") from None
        raise InputError(f"{shown(source)}: cannot read the inventory: {e.strerror}") from None
    except ValueError:  # a NUL in a path a config file gave ("a\0b")
        raise InputError(f"{shown(source)}: cannot read the inventory: a file name cannot hold a NUL character") \
            from None
    edges: list[tuple[str, str]] = []
    for path, is_vars in inventory_files(source, ignored):
        raw = read_regular(path, "the inventory")
        check_yaml(raw, path)  # the whole stream, as Ansible's parser reads it
        if is_vars:
            continue
        edges.extend(ini_group_edges(raw.decode("utf-8", "replace")))  # as Ansible may read it: INI, or YAML
        try:
            loader = InventoryLoader(raw)
            try:
                doc = loader.get_single_data()
            finally:
                loader.dispose()
        except (yaml.YAMLError, ValueError, OverflowError):
            continue  # not YAML (Ansible says so, or reads it as INI)
        edges.extend(yaml_group_edges(doc))
    problem = group_depth_problem(iter(edges))
    if problem:
        raise InputError(f"{shown(source)}: cannot read the inventory: {problem}")


# ---- what a host returns -------------------------------------------------------------------------------------------

MAX_RESULT_NODES = 200_000  # values in one module result (a host's facts: a few thousand)
MAX_RESULT_DEPTH = 32
MAX_RESULT_CHARS = 8 * MiB  # characters of its strings and keys, in all


def result_problem(document: Any) -> str | None:
    """Why DOCUMENT (a module's result, as JSON decoded it) is too large or too deeply nested to be looked at, or
    None. Iterative, and it stops at the first bound passed: bounded time, whatever the host sent."""
    nodes, chars = 0, 0
    stack: list[tuple[Any, int, Any]] = [(document, 0, None)]  # (value, depth, (parent's path, key))
    while stack:
        node, depth, path = stack.pop()
        nodes += 1
        if isinstance(node, str):
            chars += len(node)
        elif isinstance(node, (dict, list)):
            if nodes + len(stack) + len(node) > MAX_RESULT_NODES:
                return f"$: more than {MAX_RESULT_NODES} values"
            if depth >= MAX_RESULT_DEPTH:
                return f"{json_path(path)}: nested more than {MAX_RESULT_DEPTH} levels deep"
            if isinstance(node, dict):
                for key, value in node.items():
                    chars += len(key) if isinstance(key, str) else 0
                    stack.append((value, depth + 1, (path, key)))
            else:
                stack.extend((value, depth + 1, (path, i)) for i, value in enumerate(node))
        if chars > MAX_RESULT_CHARS:
            return f"$: more than {MAX_RESULT_CHARS // MiB} MiB of text"
    return None


def json_text(text: Any) -> tuple[Any, str | None]:
    """A module's result sent as one JSON text -> (the value, None), or (None, the problem): not a string, more
    than MAX_RESULT_CHARS, not JSON, or nested past what the decoder's recursion allows (result_problem bounds the
    depth of what it gives)."""
    if not isinstance(text, str):
        return None, f"$: a {type(text).__name__} where a JSON text was expected"
    if len(text) > MAX_RESULT_CHARS:
        return None, f"$: more than {MAX_RESULT_CHARS // MiB} MiB of text"
    try:
        return json.loads(text), None
    except RecursionError:
        return None, "$: nested too deep to decode"
    except ValueError as e:
        return None, f"$: not JSON: {e}"


def dropped_result(results: dict[str, Any], action: str) -> str | None:
    """ansible-runner hands on a module result of more than MAX_EVENT_RES characters (700000) as {}: the problem
    with ACTION's result in RESULTS (task action -> result), or None."""
    if action in results and results[action] == {}:
        return f"$: larger than ansible-runner hands on (MAX_EVENT_RES: {os.environ.get('MAX_EVENT_RES', '700000')} " \
               "characters)"
    return None


def json_path(path: Any) -> str:
    parts = []
    while path is not None:
        path, key = path
        parts.append(f"[{key}]" if isinstance(key, int) else f".{key}")
    text = "$" + "".join(reversed(parts))
    return text if len(text) <= MAX_SHOWN else text[:MAX_SHOWN] + "..."

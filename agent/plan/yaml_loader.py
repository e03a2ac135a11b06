"""The strict YAML loader behind configs: JSON types only, no duplicate keys, and bounded.

It composes the node graph without recursion and refuses input nested deeper than MAX_DEPTH,
aliases that would add more than MAX_ALIAS_NODES values, and integers longer than MAX_INT_CHARS,
so a hostile file fails in well under a second instead of exhausting time or memory.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import yaml

# libyaml's loader is fast; PyYAML's own one re-reads a document libyaml refused (see load_yaml).
_FastLoader: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_TIMESTAMP = "tag:yaml.org,2002:timestamp"
_MERGE = "tag:yaml.org,2002:merge"

MAX_DEPTH = 200  # nesting levels of mappings and lists, `--set` key paths included
MAX_ALIAS_NODES = 1_000_000  # values that aliases (*name, <<: *name) may add beyond the text's own
MAX_INT_CHARS = 1000  # an integer's text, sign and underscores included


class KeyProblem(yaml.constructor.ConstructorError):
    """A duplicate or non-string key; its message already says how to fix it."""


class Refused(yaml.composer.ComposerError):
    """Input past a limit (depth, alias expansion, a recursive alias); the message says which."""


class TooDeep(Refused):
    """Nested deeper than the loader's max_depth: the problem reads "nested more than N levels"."""


if TYPE_CHECKING:  # the mixin is only ever used in front of a SafeLoader (see _strict_loader)
    _Loader = yaml.SafeLoader
else:
    _Loader = object


class _Strict(_Loader):
    """A SafeLoader's rules, mixed in front of libyaml's or PyYAML's own loader: it builds only
    JSON types and rejects duplicate and non-string keys.

    It composes the node graph itself, without recursion (libyaml's composer recurses in C and
    crashes the interpreter on deep input), refusing input nested more than `max_depth` levels
    and aliases that would expand the document by more than MAX_ALIAS_NODES values.
    """

    max_depth = MAX_DEPTH

    def get_single_node(self) -> yaml.Node | None:
        self.get_event()  # STREAM-START
        document = None
        if not self.check_event(yaml.StreamEndEvent):
            self.get_event()  # DOCUMENT-START
            document = self._compose_tree()
            self.get_event()  # DOCUMENT-END
        if not self.check_event(yaml.StreamEndEvent):
            event = self.get_event()
            raise yaml.composer.ComposerError(
                "expected a single document in the stream",
                document.start_mark if document else None,
                "but found another document",
                event.start_mark,
            )
        self.get_event()  # STREAM-END
        return document

    def _compose_tree(self) -> yaml.Node:
        """PyYAML's Composer.compose_node, with an explicit stack and the limits counted."""
        anchors: dict[str, yaml.Node] = {}
        expanded_size: dict[str, int] = {}  # anchor -> values its node stands for, aliases expanded
        stack: list[list[Any]] = []  # [node, anchor, total when it started, pending mapping key]
        total = written = 0  # values so far, aliases expanded / as written
        while True:
            event = self.get_event()
            # libyaml's marks or PyYAML's (the stubs type them apart); both say line and column
            start: Any = event.start_mark
            end: Any = event.end_mark
            if isinstance(event, yaml.AliasEvent):
                name = event.anchor
                if name not in anchors:
                    raise yaml.composer.ComposerError(
                        None, None, f"found undefined alias {name!r}", start
                    )
                if name not in expanded_size:
                    raise Refused(
                        None,
                        None,
                        f"alias *{name} is inside the value anchored as &{name}, so the value "
                        "would contain itself; write it out instead",
                        start,
                    )
                node: yaml.Node = anchors[name]
                total += expanded_size[name]
                written += 1
                if total - written > MAX_ALIAS_NODES:
                    raise Refused(
                        None,
                        None,
                        f"aliases expand the document by more than {MAX_ALIAS_NODES:,} values "
                        "(an alias bomb?); write the repeated parts out, or repeat less",
                        start,
                    )
            elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
                node, anchor, started, _ = stack.pop()
                node.end_mark = end
                if anchor is not None:
                    expanded_size[anchor] = total - started
            else:
                anchor = event.anchor
                if anchor is not None and anchor in anchors:
                    raise yaml.composer.ComposerError(
                        f"found duplicate anchor {anchor!r}; first occurrence",
                        anchors[anchor].start_mark,
                        "second occurrence",
                        start,
                    )
                total += 1
                written += 1
                tag = event.tag
                if isinstance(event, yaml.ScalarEvent):
                    if tag is None or tag == "!":
                        tag = self.resolve(yaml.ScalarNode, event.value, event.implicit)
                    node = yaml.ScalarNode(tag, event.value, start, end, style=event.style)
                    if anchor is not None:
                        anchors[anchor] = node
                        expanded_size[anchor] = 1
                else:
                    kind = (
                        yaml.SequenceNode
                        if isinstance(event, yaml.SequenceStartEvent)
                        else yaml.MappingNode
                    )
                    if len(stack) >= self.max_depth:
                        raise TooDeep(
                            None,
                            None,
                            f"nested more than {self.max_depth} levels",
                            event.start_mark,
                        )
                    if tag is None or tag == "!":
                        tag = self.resolve(kind, None, event.implicit)
                    node = kind(tag, [], event.start_mark, None, flow_style=event.flow_style)
                    if anchor is not None:
                        anchors[anchor] = node  # its size is known (and *anchor usable) at its end
                    stack.append([node, anchor, total - 1, None])
                    continue
            if not stack:
                return node
            parent = stack[-1]
            if isinstance(parent[0], yaml.SequenceNode):
                parent[0].value.append(node)
            elif parent[3] is None:
                parent[3] = node
            else:
                parent[0].value.append((parent[3], node))
                parent[3] = None

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        # Checked on the raw node: after PyYAML flattens `<<` merges, an explicit key that
        # overrides a merged one would look like a duplicate.
        first_line: dict[str, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE:
                continue
            mark = key_node.start_mark
            if not isinstance(key_node, yaml.ScalarNode):  # not built: it may be deep or huge
                kind = "list" if isinstance(key_node, yaml.SequenceNode) else "dict"
                raise KeyProblem(None, None, f"key is a {kind}, not a string; quote it", mark)
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, str):
                raise KeyProblem(
                    None,
                    None,
                    f"key {brief(key)} is a {type(key).__name__}, not a string; quote it",
                    mark,
                )
            if key in first_line:
                raise KeyProblem(
                    None,
                    None,
                    f"duplicate key {brief(key)} (first at line {first_line[key]}); "
                    "remove one of them",
                    mark,
                )
            first_line[key] = mark.line + 1
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        # int() of a long digit string is refused by Python (over 4300 digits) or, for YAML 1.1's
        # base-60 ints (1:30:00), takes quadratic time: a config number is never that long.
        if len(node.value) > MAX_INT_CHARS:
            raise Refused(
                None,
                None,
                f"an integer {len(node.value):,} characters long (the limit is {MAX_INT_CHARS}); "
                "quote it to keep it as text",
                node.start_mark,
            )
        return super().construct_yaml_int(node)


# The payload is JSON: dates stay text, and tags building bytes, sets or ordered pairs are errors.
_NOT_JSON = {
    f"tag:yaml.org,2002:{name}" for name in ("timestamp", "binary", "set", "omap", "pairs")
}


def _strict_loader(base: Any) -> Any:
    loader: Any = type(f"Strict{base.__name__}", (_Strict, base), {})
    loader.yaml_constructors = {
        tag: build for tag, build in base.yaml_constructors.items() if tag not in _NOT_JSON
    }
    loader.yaml_constructors["tag:yaml.org,2002:int"] = _Strict.construct_yaml_int
    loader.yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag != _TIMESTAMP]
        for first, resolvers in base.yaml_implicit_resolvers.items()
    }
    # YAML 1.1 reads `3e-4` (no dot) as a string; learning rates are written that way all the time.
    loader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+$"),
        list("-+0123456789"),
    )
    return loader


class _BoundedScanner(yaml.SafeLoader):
    """PyYAML's scanner looks ahead up to 1,024 characters in flow style, checking every open
    level at each token: quadratic on `[[[[…`. It stops at the composer's depth (flow levels plus
    open block collections), so it never reads more than max_depth levels ahead."""

    max_depth = MAX_DEPTH

    def fetch_flow_collection_start(self, token_class: type) -> None:
        if self.flow_level + len(self.indents) >= self.max_depth:
            mark = self.get_mark()
            raise TooDeep(None, None, f"nested more than {self.max_depth} levels", mark)
        super().fetch_flow_collection_start(token_class)


_StrictLoader = _strict_loader(_FastLoader)
_StrictPureLoader = _strict_loader(_BoundedScanner)


def load_yaml(text: str, max_depth: int = MAX_DEPTH) -> Any:
    """The document in text, read by libyaml; when libyaml refuses it, by PyYAML's own scanner.

    The second reading makes the error the same whatever libyaml a PyYAML wheel bundles: the
    libyaml of PyYAML 6.0.4 stops at 1,000 nesting levels while scanning ahead (up to 1,024
    characters per line in flow style), before our MAX_DEPTH could speak; PyYAML's scanner has no
    such limit, so our composer refuses the same text at its own limit, with its own message.
    Errors are rare and the text is bounded (--max-config-bytes), so the second pass is cheap."""
    try:
        return _load(_StrictLoader, text, max_depth)
    except (Refused, KeyProblem):
        raise  # our own verdicts: the same from either loader
    except yaml.YAMLError:
        if _StrictLoader is _StrictPureLoader:
            raise
        return _load(_StrictPureLoader, text, max_depth)


def _load(loader_class: type, text: str, max_depth: int) -> Any:
    loader = loader_class(text)
    loader.max_depth = max_depth
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def brief(value: object, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."

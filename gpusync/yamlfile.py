"""Every YAML file gpusync reads (profiles, tuned settings), read within bounds.

A YAML alias names a node written once and used again: a few hundred bytes of nested aliases
("billion laughs") stand for billions of values, and whatever walks them afterwards (a check,
the job sent to the child, a report) never ends. The composed document is measured as it
would be expanded, before anything is constructed, and refused past MAX_NODES, as is a file
past MAX_BYTES, a recursive alias, a document nested too deeply, and a key given twice (YAML
keeps the last silently)."""
from __future__ import annotations

import yaml

from .errors import BadInput

MAX_BYTES = 1 << 20  # a profile or tuned file is a few KiB
MAX_NODES = 100_000  # values once aliases are expanded


class TooLarge(yaml.YAMLError):
    pass


def expanded_size(node, limit: int = MAX_NODES) -> int:
    """How many nodes `node` stands for with every alias expanded; TooLarge past `limit` or
    for a node that contains itself. Each node is measured once (memo), so a bomb is measured
    in as many steps as it has lines."""
    sizes: dict[int, int] = {}
    open_: set[int] = set()

    def size(n) -> int:
        key = id(n)
        if key in sizes:
            return sizes[key]
        if key in open_:
            raise TooLarge(f"a recursive alias (line {n.start_mark.line + 1})")
        open_.add(key)
        total = 1
        if isinstance(n, yaml.SequenceNode):
            total += sum(size(child) for child in n.value)
        elif isinstance(n, yaml.MappingNode):
            total += sum(size(k) + size(v) for k, v in n.value)
        open_.discard(key)
        if total > limit:
            raise TooLarge(f"more than {limit} values once its aliases are expanded")
        sizes[key] = total
        return total

    return size(node) if node is not None else 0


class BoundedLoader(yaml.SafeLoader):
    """safe_load, measured (expanded_size) before constructing, and a key given twice is an
    error."""

    def compose_document(self):
        node = super().compose_document()
        expanded_size(node)
        return node

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
            except TypeError:  # an unhashable key: construct_mapping says so itself
                break
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key '{key}'", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load(text: str, what: str):
    """The data of a YAML document; BadInput (one line, naming `what` and the line) when it is
    not valid YAML or is past the bounds."""
    if len(text) > MAX_BYTES:
        raise BadInput(f"{what} is larger than {MAX_BYTES >> 10} KiB: not a gpusync file")
    try:
        return yaml.load(text, Loader=BoundedLoader)  # noqa: S506 (a SafeLoader)
    except TooLarge as e:
        raise BadInput(f"{what} is refused: {e}") from None
    except RecursionError:
        raise BadInput(f"{what} is refused: nested too deeply") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise BadInput(f"{what} is not valid YAML{where}: "
                       f"{getattr(e, 'problem', None) or e}") from None

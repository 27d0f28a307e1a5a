"""A griffe extension for the API reference: an attribute without a docstring (a config dataclass field, a module
constant) gets the comment written beside it in the source, so the one description per field lives in the code
and the site renders it. Comment lines that follow the statement and are indented further after the ``#`` (the
continuation of a long comment) are part of it."""
from __future__ import annotations

import ast
import io
import tokenize
from typing import Any

import griffe


def trailing_comment(lines: list[str], first: int, last: int) -> str:
    """The comment on source lines ``first``..``last`` (1-based, the statement) and its continuation lines."""
    text = "".join(line + "\n" for line in lines[first - 1:last])
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError):
        return ""
    parts = [t.string[1:].strip() for t in tokens if t.type == tokenize.COMMENT]
    if not parts:
        return ""
    for line in lines[last:]:
        body = line.strip()
        if not (body.startswith("#") and body[1:].startswith("  ")):
            break
        parts.append(body[1:].strip())
    return " ".join(parts)


class FieldComments(griffe.Extension):
    def on_attribute_instance(self, *, node: ast.AST | griffe.ObjectNode, attr: griffe.Attribute,
                              agent: griffe.Visitor | griffe.Inspector, **kwargs: Any) -> None:
        if attr.docstring is not None or attr.lineno is None or not isinstance(node, ast.AST):
            return
        comment = trailing_comment(attr.lines_collection[attr.filepath], attr.lineno, attr.endlineno or attr.lineno)
        if comment:
            attr.docstring = griffe.Docstring(comment, parent=attr)

"""Whether lines of JSON text, fed one by one, can still be one JSON value: the brackets they leave open.

``rttsched publish`` reads a stream line by line (:mod:`app.bridge.records`); a line that is not JSON by itself
but opens a bracket may be the first line of a pretty-printed document. :class:`Brackets` follows the brackets
and strings of such lines -- not the rest of the grammar, which the parse of the whole document checks -- and
says after each line whether the value is :data:`CLOSED` (every bracket closed), still :data:`OPEN`, or
:data:`BROKEN`: a closing bracket that matches none, or a line break inside a string (a line cut short).

>>> b = Brackets()
>>> b.feed(b'{\\n'), b.feed(b'  "spans": [{"name": "a]}"},\\n'), b.feed(b'  {}]\\n'), b.feed(b'}\\n')
('open', 'open', 'open', 'closed')
>>> Brackets().feed(b'{"resourceSpans":[{"resource":{"attri\\n')
'broken'
>>> Brackets().feed(b'{"a": [1, 2}\\n')
'broken'
"""

from __future__ import annotations

import re

OPEN = "open"
CLOSED = "closed"
BROKEN = "broken"

_OUTSIDE = re.compile(rb'["{}\[\]]')  # what matters outside a string
_INSIDE = re.compile(rb'["\\\n]')  # and inside one
_OPENER = {ord("}"): ord("{"), ord("]"): ord("[")}


class Brackets:
    """The brackets left open by the JSON text fed so far, and whether it stands inside a string."""

    def __init__(self) -> None:
        self.open = bytearray()  # the brackets not closed yet, innermost last
        self.in_string = False

    def feed(self, data: bytes) -> str:
        """Follow ``data`` (a line with its line break): :data:`CLOSED` once the first bracket opened is closed
        (what follows it on the line is not looked at), else :data:`OPEN` or :data:`BROKEN`.

        >>> b = Brackets()
        >>> b.feed(b'["a\\\\"]", "\\\\\\\\"\\n'), b.feed(b']\\n')
        ('open', 'closed')
        >>> Brackets().feed(b'"no bracket"\\n'), Brackets().feed(b'}\\n')
        ('closed', 'broken')
        """
        i = 0
        while True:
            if self.in_string:
                m = _INSIDE.search(data, i)
                if m is None:
                    return OPEN
                c = data[m.start()]
                if c == ord('"'):
                    self.in_string = False
                    i = m.end()
                elif c == ord("\\") and m.end() < len(data) and data[m.end()] != ord("\n"):
                    i = m.end() + 1  # the escaped character, whatever it is
                else:
                    return BROKEN  # a line break inside a string: JSON has none
            else:
                m = _OUTSIDE.search(data, i)
                if m is None:
                    return OPEN if self.open else CLOSED
                c = data[m.start()]
                i = m.end()
                if c == ord('"'):
                    self.in_string = True
                elif c in _OPENER:
                    if not self.open or self.open[-1] != _OPENER[c]:
                        return BROKEN
                    self.open.pop()
                    if not self.open:
                        return CLOSED
                else:
                    self.open.append(c)

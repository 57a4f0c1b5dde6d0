"""Sink options: parsed once into a frozen, typed :class:`SinkOptions`.

The same options reach lakesink from ``writeStream.option(...)`` (keys arrive lower-cased from
Spark) and from keyword arguments of :func:`lakesink.foreach_batch`. Each option is declared once, in
:data:`OPTIONS`; adding one is: its key constant, its :class:`Option` row, its :class:`SinkOptions` field (and its
parser when it goes with others), foreach_batch's keyword, and the rows of docs/options.md -- tests/test_options.py
fails until the signature and the docs agree with the declaration.

By subject: :mod:`~lakesink.options.keys` (the option names), :mod:`~lakesink.options.values` (typed values and
the parsers of one value), :mod:`~lakesink.options.declaration` (:data:`OPTIONS`), :mod:`~lakesink.options.sink`
(:class:`SinkOptions`), :mod:`~lakesink.options.read` (:class:`ReadOptions`); every name is importable from here.
"""

from __future__ import annotations

from lakesink.options.declaration import *  # noqa: F403
from lakesink.options.keys import *  # noqa: F403
from lakesink.options.read import *  # noqa: F403
from lakesink.options.sink import *  # noqa: F403
from lakesink.options.values import *  # noqa: F403

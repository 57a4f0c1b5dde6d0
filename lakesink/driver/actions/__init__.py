"""What one batch commits into a table, as commit actions of the loop (lakesink.driver.loop).

- :mod:`~lakesink.driver.actions.batch`: a batch's commit call and its actions (append, overwrite, upsert, an empty
  batch's marker, a replay found at plan time), one table's action in a routed batch's unit (its "already committed?"
  the whole batch's: ``BatchAction.as_unit_member``), and what came of it (BatchOutcome);
- :mod:`~lakesink.driver.actions.upsert`: the copy-on-write of the files that hold an upsert batch's keys;
- :mod:`~lakesink.driver.actions.completeness`: what a batch records about event time (the watermark);
- :mod:`~lakesink.driver.actions.dead_letters`: the dead-letter table's options, max-rejected-fraction, reject-when.
"""

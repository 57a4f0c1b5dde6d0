"""The physical plans of the SQL executions a local Spark session ran, from Spark's SQL status store (kept with the UI
off): what the tests of the Spark writer read to count the jobs that read a batch or write its files."""

from __future__ import annotations

from typing import Any


def executions_since(spark: Any, seen: set[int]) -> list[str]:
    """The physical plans of the SQL executions Spark ran since ``seen`` (execution ids, updated)."""
    spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty(60_000)
    executions = spark._jsparkSession.sharedState().statusStore().executionsList()
    plans = []
    for i in range(executions.size()):
        execution = executions.apply(i)
        if execution.executionId() not in seen:
            seen.add(execution.executionId())
            plans.append(execution.physicalPlanDescription())
    return plans

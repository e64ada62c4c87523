"""The run's machinery, private: what `Agent` drives for each run.

- `loop`: the step loop (model step, tool step, until a stop);
- `writer`: `StepWriter`, everything a run saves, fenced by the run's lease;
- `heartbeat`: renews that lease in the background while the run lives;
- `hooks`: calls the context providers' `before_run` and `after_run`;
- `replay`: finds the earlier run of a retried input, to give back its result or resume it;
- `tool_chain`: runs each tool call through the providers' tool middleware, and records it;
- `invariants`: what every request must satisfy before it is sent to a model.
"""

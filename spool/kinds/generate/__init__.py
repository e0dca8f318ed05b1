"""The ``generate`` kind: a clip from a hosted video model, published like a render.

One folder, one concept each (see ARCHITECTURE.md, "The generate kind"):

* :mod:`.spec`: the job record (provider, model, input);
* :mod:`.kind`: the kind itself (freeze, gate, the driven runner's entry points);
* :mod:`.workflow`: the step function, ``(state, evidence) -> (effect, next state)``;
* :mod:`.runner`: performs the workflow's effects (provider calls, durable writes);
* :mod:`.states`: the attempt's durable states and create log, each move a compare-and-set;
* :mod:`.ledger`: which attempt owns which provider job (the adoption rule);
* :mod:`.retries`: the retry table per remote operation, and provider back-pressure;
* :mod:`.spending`: the spending guard; :mod:`.admission`: what the daemon may claim now;
* :mod:`.providers`: the provider contract, Replicate, Runway, plug-ins, settings.

Light on purpose (see :mod:`spool.kinds`): ``spool.toml``'s provider tables are
parsed by :mod:`.providers.config` without loading the rest.
"""

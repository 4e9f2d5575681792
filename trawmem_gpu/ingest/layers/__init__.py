"""The layers of a bank beside its turns, made at build time: source-linked atomic facts
(``facts.attach_facts``: LoCoMo's observations, ``locomo``, or LLM extraction, ``extract`` over
TriMem's ``trimem_extract``) and per-person profile sections (``profiles.attach_profiles`` over
TriMem's ``trimem_profiles``), with the prompts they are written by (``prompts``); ``steps``: each
layer's build step, in build order, which ``trawmem build``, ``Memory.add`` and prompt evolution
run. Their records, files, forget and view are the store's (``store.layers``, ``store.facts``)."""

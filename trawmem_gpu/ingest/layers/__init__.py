"""The layers of a bank beside its turns, made at build time: source-linked atomic facts
(``facts.attach_facts``: LoCoMo's observations, ``locomo``, or LLM extraction, ``extract`` over
TriMem's ``trimem_extract``) and per-person profile sections (``profiles.attach_profiles`` over
TriMem's ``trimem_profiles``), with the prompts they are written by (``prompts``). Their records
are the store's (``store.facts``); the unit view selection reads is ``store.view``."""

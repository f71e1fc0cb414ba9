"""Training a draft for the served target on its own responses.

The training itself is the ``speculators`` library's (vLLM's draft-model library:
EAGLE-3 model, test-time-training loss, vocabulary maps); this package holds the
seams around it:

- :mod:`.layout`     the data directory: samples, hidden-state shards, manifest;
- :mod:`.regenerate` responses from the served target (OpenAI-compatible server,
  or transformers for small CPU runs);
- :mod:`.capture`    the target's hidden states at the EAGLE-3 aux layers (vLLM's
  ``extract_hidden_states`` method, or transformers for small CPU runs);
- :mod:`.bridge`     speculators model <-> the flat EAGLE-3 directory vLLM loads;
- :mod:`.trainer`    ``draft train``: the training loop on one device;
- :mod:`.evaluate`   teacher-forced acceptance: sum(min(p, q)) per position, tau at k;
- :mod:`.bill`       what the same pipeline costs for Kimi-K2.5 on 8 PCIe GPUs;
- :mod:`.cli`        the ``vllm-kimi-ext draft regenerate|capture|train|eval|bill``
  subcommands.

Nothing here is imported by the plugin; torch, transformers and speculators are
imported inside the functions that need them.
"""

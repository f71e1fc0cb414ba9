"""``vllm-kimi-ext doctor``: a draft checkpoint checked against a Kimi-K2.5 target.

:mod:`.diagnosis` runs the checks (:mod:`.checks`) on configs validated by
:mod:`.config_fields`, with the draft kinds of :mod:`.draft_kinds`; every finding code is in
:mod:`.codes`.
"""

"""Install one feature's runtime patches for a test, and take them out again.

``with installed("Kimi-K2.5 MTP drafts"):`` applies the patch classes that
``vllm_kimi_ext.runtime.FEATURES`` lists under that name (and registers the plugin's
model classes), then reverts exactly the classes it applied, so a test sees vLLM as
the plugin leaves it and the next test sees it as it was.
"""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def installed(feature_name: str):
    from vllm_kimi_ext import runtime

    (feature,) = [f for f in runtime.FEATURES if f.name == feature_name]
    classes = [runtime.resolve(ref) for ref in feature.patches]
    applied = [cls for cls in classes if cls.apply()]
    runtime.register_models()
    try:
        yield classes
    finally:
        for cls in reversed(applied):
            cls.revert()

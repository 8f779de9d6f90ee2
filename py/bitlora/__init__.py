

def __getattr__(name):
    # lazy: `import bitlora` stays cheap; load_model pulls in the model and the GPU
    if name in ("load_model", "aload_model"):
        from . import api
        return getattr(api, name)
    raise AttributeError(f"module 'bitlora' has no attribute {name!r}")

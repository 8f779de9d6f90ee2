"""Model references on the Hugging Face Hub: a repo id (`org/name`, `org/name@rev`)
or a hub URL (`https://huggingface.co/org/name`, `.../tree/rev`, `.../blob/rev/f.gguf`,
`.../resolve/rev/f.gguf`) -> the files to download and their URLs
(`{base}/{repo}/resolve/{rev}/{file}`, the layout a mirror keeps too).

Only names and URLs: the page's worker downloads (with byte progress, into the
browser's Cache Storage). Standard library only: this module runs in the browser.
"""
from __future__ import annotations

import re
import urllib.parse

HUB = "https://huggingface.co"
FILES = ("config.json", "tokenizer.json", "model.safetensors")   # a BitNet HF folder, as the page loads it
OPTIONAL = ("tokenizer.json",)                                   # a GGUF carries its own tokenizer
_ID = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_REPO = re.compile(rf"^({_ID}/{_ID})(?:@([A-Za-z0-9._/-]+))?$")


def parse(text: str, base: str = HUB) -> dict | None:
    """{"repo", "revision", "files"} for a repo id or a URL under `base`; None for anything
    else (a plain URL of a file elsewhere)."""
    text = text.strip()
    m = _REPO.match(text)
    if m:
        return {"repo": m.group(1), "revision": m.group(2) or "main", "files": list(FILES)}
    base = base.rstrip("/")
    if not text.startswith(base + "/"):
        return None
    parts = [urllib.parse.unquote(p) for p in urllib.parse.urlsplit(text[len(base):]).path.split("/") if p]
    if len(parts) < 2 or not re.fullmatch(_ID, parts[0]) or not re.fullmatch(_ID, parts[1]):
        return None
    repo, rest = "/".join(parts[:2]), parts[2:]
    if not rest:
        return {"repo": repo, "revision": "main", "files": list(FILES)}
    if rest[0] == "tree" and len(rest) == 2:
        return {"repo": repo, "revision": rest[1], "files": list(FILES)}
    if rest[0] in ("blob", "resolve") and len(rest) >= 3:
        file = "/".join(rest[2:])
        files = [file] if file.endswith(".gguf") else list(FILES)
        return {"repo": repo, "revision": rest[1], "files": files}
    return None


def file_url(repo: str, revision: str, file: str, base: str = HUB) -> str:
    return f"{base.rstrip('/')}/{repo}/resolve/{urllib.parse.quote(revision, safe='')}/{file}"


def cache_dir() -> str:
    """Where native downloads go: $BITLORA_CACHE, else ~/.cache/bitlora."""
    import os
    return os.environ.get("BITLORA_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "bitlora")


def base_url() -> str:
    """The hub's base URL: $BITLORA_HUB (a mirror), else huggingface.co."""
    import os
    return os.environ.get("BITLORA_HUB") or HUB


def download(text: str, progress=None, base: str | None = None, cache: str | None = None) -> tuple | None:
    """Natively: a repo id or hub URL -> (local path, repo) after downloading its files
    into the cache folder once (a file already there is not fetched again); None if
    `text` is not a hub reference. progress(done_bytes, total_bytes) per file."""
    import os
    import urllib.error
    import urllib.request
    base = base or base_url()
    ref = parse(text, base)
    if ref is None:
        return None
    folder = os.path.join(cache or cache_dir(), "hub", *ref["repo"].split("/"), ref["revision"].replace("/", "--"))
    os.makedirs(folder, exist_ok=True)
    for name in ref["files"]:
        path = os.path.join(folder, name)
        if os.path.exists(path):
            continue
        url = file_url(ref["repo"], ref["revision"], name, base)
        try:
            with urllib.request.urlopen(url, timeout=60) as resp, open(path + ".part", "wb") as f:
                total, done = int(resp.headers.get("Content-Length") or 0), 0
                while chunk := resp.read(1 << 20):
                    f.write(chunk)
                    done += len(chunk)
                    if progress is not None:
                        progress(done, max(total, done))
        except urllib.error.HTTPError as e:
            if e.code == 404 and name in OPTIONAL:
                continue
            raise OSError(f"{url}: HTTP {e.code} {e.reason}") from None
        except urllib.error.URLError as e:
            raise OSError(f"{url}: {e.reason}") from None
        os.replace(path + ".part", path)
    first = ref["files"][0]
    return (os.path.join(folder, first) if first.endswith(".gguf") else folder), ref["repo"]

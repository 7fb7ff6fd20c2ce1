"""The tokenizer and chat templates OUT ships, checked as a user's would load them: part of what "verified" means
(`checkpoint.verify_output`, `rope-extend verify`), beside the RoPE check of `verify.py`."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

from .errors import VerificationError

VOCABULARY_FILES = ("tokenizer.json", "tokenizer.model", "spiece.model", "vocab.json", "vocab.txt", "tiktoken.model")
JSON_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "vocab.json",
              "chat_template.json")
TEMPLATE_DIR = "additional_chat_templates"  # transformers >= 4.54: one .jinja file per named template


def verify_tokenizer(folder) -> None:
    """Raise VerificationError unless the tokenizer and chat templates in `folder` load as a user's would: each
    tokenizer JSON file parses, `AutoTokenizer.from_pretrained(folder)` loads, and every chat template (in
    tokenizer_config.json's `chat_template`, chat_template.jinja, chat_template.json, additional_chat_templates/)
    compiles as `apply_chat_template` compiles it. A folder without a vocabulary file passes (a model may ship no
    tokenizer);
    a tokenizer whose class is remote code is not run (nothing is trusted by default), nor is one whose library
    (sentencepiece, tiktoken) is not installed here: a missing library is this machine's, not the file's."""
    root = Path(folder)
    for name in JSON_FILES:
        path = root / name
        if path.is_file():
            try:
                json.loads(path.read_text(encoding="utf-8"))
            except (ValueError, UnicodeDecodeError) as exc:
                raise VerificationError(f"{name} is not valid JSON ({_one_line(exc)}), so the tokenizer does not "
                                        "load; restore it from SOURCE or re-download it") from None
    for name, template in _chat_templates(root):
        try:
            compile_chat_template(template)
        except ImportError:  # jinja2 missing or too old here: apply_chat_template could not run either way
            continue
        except Exception as exc:  # jinja2's TemplateSyntaxError and friends
            line = getattr(exc, "lineno", None)
            raise VerificationError(f"the chat template in {name} does not compile ({type(exc).__name__}"
                                    f"{f' on line {line}' if line else ''}: {_one_line(exc)}), so "
                                    "apply_chat_template fails; fix the template") from None
    if any((root / name).is_file() for name in VOCABULARY_FILES) and not _remote_tokenizer(root):
        _load_tokenizer(root)


def _chat_templates(root) -> list[tuple[str, str]]:
    """(where, template) for every chat template transformers would read from `root`."""
    found = []
    config = root / "tokenizer_config.json"
    if config.is_file():
        value = _json_object(config).get("chat_template")
        if isinstance(value, str):
            found.append(("tokenizer_config.json", value))
        elif isinstance(value, list):  # [{"name": ..., "template": ...}]
            found += [(f"tokenizer_config.json ({item.get('name')})", item["template"]) for item in value
                      if isinstance(item, dict) and isinstance(item.get("template"), str)]
    if (root / "chat_template.jinja").is_file():
        found.append(("chat_template.jinja", (root / "chat_template.jinja").read_text(encoding="utf-8")))
    if (root / "chat_template.json").is_file():
        value = _json_object(root / "chat_template.json")
        if isinstance(value.get("chat_template"), str):
            found.append(("chat_template.json", value["chat_template"]))
    if (root / TEMPLATE_DIR).is_dir():
        found += [(f"{TEMPLATE_DIR}/{path.name}", path.read_text(encoding="utf-8"))
                  for path in sorted((root / TEMPLATE_DIR).glob("*.jinja"))]
    return found


def _json_object(path) -> dict:
    value = json.loads(path.read_text(encoding="utf-8"))
    return value if isinstance(value, dict) else {}


def _remote_tokenizer(root) -> bool:
    config = root / "tokenizer_config.json"
    if not config.is_file():
        return False
    auto_map = _json_object(config).get("auto_map")
    return isinstance(auto_map, (dict, list)) and "AutoTokenizer" in str(auto_map)


def _load_tokenizer(root) -> None:
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            AutoTokenizer.from_pretrained(root)
    except ImportError:  # a tokenizer library this machine lacks
        return
    except Exception as exc:  # whatever the tokenizer classes raise on a file they cannot read
        reason = _one_line(exc).replace(str(root), "OUT")  # never the temporary folder's name
        raise VerificationError(f"the tokenizer does not load (AutoTokenizer.from_pretrained: {type(exc).__name__}: "
                                f"{reason}); restore the tokenizer files from SOURCE or re-download them"
                                ) from None
    finally:
        hf_logging.set_verbosity(verbosity)


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())[:200] or type(exc).__name__


def compile_chat_template(template: str):
    """Compile a chat template as `apply_chat_template` does (transformers' sandboxed jinja2 environment with its
    filters and extensions, cached); raises jinja2's TemplateError (a syntax error names its line)."""
    from transformers.utils import chat_template_utils

    compile_template = getattr(chat_template_utils, "_compile_jinja_template", None)
    if compile_template is None:  # not in every release: the same sandbox, without transformers' extras
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        return environment.from_string(template)
    return compile_template(template)

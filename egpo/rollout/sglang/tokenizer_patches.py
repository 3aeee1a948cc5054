"""Parent-process patches on sglang's ``TokenizerManager``: ``meta_info["output_token_entropy"]``.

The detokenizer already copies ``output_token_entropy_val`` from ``BatchTokenIDOutput`` into ``BatchStrOutput``.
Here each request's values are accumulated on its ``ReqState`` exactly where its output log probs are
(``convert_logprob_style``, which runs when the request asked for log probs) and published next to them
(``add_logprob_to_meta_info``, which also runs on abort), so the list is cumulative and aligned 1:1 with
``meta_info["output_token_logprobs"]``. egpo's server always asks for log probs when it wants entropy.
"""

from __future__ import annotations

from egpo.patching import Patch, apply_all
from egpo.rollout.sglang import META_KEY
from egpo.rollout.sglang.versions import check_parameters, import_target

STATE_VALUES = "egpo_output_token_entropy"

CONVERT_PARAMS = ("meta_info", "state", "top_logprobs_num", "token_ids_logprob", "return_text_in_logprobs",
                  "recv_obj", "recv_obj_index")
ADD_PARAMS = ("meta_info", "state", "top_logprobs_num", "token_ids_logprob", "return_text_in_logprobs")


def convert_logprob_style_with_entropy(original, self, meta_info, state, top_logprobs_num, token_ids_logprob,
                                       return_text_in_logprobs, recv_obj, recv_obj_index):
    column = getattr(recv_obj, "output_token_entropy_val", None)
    # the original returns early, accumulating nothing, when the message carries no log probs
    if column is not None and recv_obj.input_token_logprobs_val is not None:
        values = getattr(state, STATE_VALUES, None)
        if values is None:
            values = []
            setattr(state, STATE_VALUES, values)
        values.extend(column[recv_obj_index])
    return original(self, meta_info, state, top_logprobs_num, token_ids_logprob, return_text_in_logprobs, recv_obj,
                    recv_obj_index)


def add_logprob_to_meta_info_with_entropy(original, self, meta_info, state, top_logprobs_num, token_ids_logprob,
                                          return_text_in_logprobs):
    original(self, meta_info, state, top_logprobs_num, token_ids_logprob, return_text_in_logprobs)
    values = getattr(state, STATE_VALUES, None)
    if values is not None:
        meta_info[META_KEY] = list(values)


_MANAGER = "sglang.srt.managers.tokenizer_manager:TokenizerManager"
CONVERT = Patch(f"{_MANAGER}.convert_logprob_style", convert_logprob_style_with_entropy)
ADD = Patch(f"{_MANAGER}.add_logprob_to_meta_info", add_logprob_to_meta_info_with_entropy)
PATCHES = (CONVERT, ADD)


def apply_tokenizer_patches() -> None:
    """Idempotent; both targets are checked before either is changed."""
    import_target("sglang.srt.managers.tokenizer_manager")
    for patch, params in ((CONVERT, CONVERT_PARAMS), (ADD, ADD_PARAMS)):
        check_parameters(patch.original(), params, patch.dotted)
    apply_all(PATCHES)

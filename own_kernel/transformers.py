"""``own_kernel.transformers``, the public name of the Hugging Face integration
(own_kernel/integrations/transformers.py): ``patch``, ``unpatch``, ``token_logprobs``."""
from own_kernel.integrations.transformers import (LOGIT_TRANSFORMS, SUPPORTED, patch,
                                                  token_logprobs, unpatch)

__all__ = ["patch", "unpatch", "token_logprobs", "SUPPORTED", "LOGIT_TRANSFORMS"]

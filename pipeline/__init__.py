"""decision-pipeline: the library of stage functions (never imports Prefect)."""

import logging

# bitsandbytes (which peft imports) warns at every import, on CPUs with AVX512-BF16, that its optional 4-bit
# CPU kernel package is missing: that kernel comes from the Hugging Face Hub, which a run never reaches, and
# CPU training is never 4-bit. Its errors still show.
logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)

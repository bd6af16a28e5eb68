"""Weight quantization: codecs (fp8, MXFP4, int8, int4), a linear layer that stays quantized in
memory, and the quantized checkpoint directory that ``onepass quantize`` writes and the torch
backend loads."""

"""The attention problems we measure on the H200 (issue: foundation), shared by the benchmark
and search scripts so that every figure refers to the same shapes."""

SHAPES = {
    # text queries after four 256-token images
    "text_over_image": "b=8,h=28,hkv=4,lq=128,lk=1152,d=128,causal=1",
    # 16 images of 324 tokens (512x512) in an 8k prefill: causal, bidirectional inside each image
    "multi_image_spans": "b=1,h=28,hkv=4,l=8192,d=128,causal=1,spans=16,span_len=324",
    "multi_image_causal": "b=1,h=28,hkv=4,l=8192,d=128,causal=1",
    "video_audio_prefill": "b=1,h=32,hkv=4,l=12800,d=128,causal=1",
    "dit_joint": "b=2,h=24,hkv=24,l=4352,d=128",
    # one new token over a 4k context (the mask is irrelevant for a single query row)
    "decode_like": "b=64,h=28,hkv=4,lq=1,lk=4096,d=128",
}

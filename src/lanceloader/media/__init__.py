"""Media: probing and decoding video and audio files (pure functions, no Lance).

- :mod:`lanceloader.media.video`: ``probe_video`` (frame count, rate, keyframe index, where an
  MP4's ``moov`` box is), ``clip_byte_ranges`` (the bytes a clip needs) and ``decode_clip``
  (frame-accurate decode from only those bytes), through PyAV's bundled FFmpeg.
- :mod:`lanceloader.media.audio`: ``probe_audio`` and decoding, cropping and resampling audio
  (``audio_window``: a window's checks, span, resampling and mixing; ``audio_index``: where a
  file's frames lie; ``audio_ranges``: the bytes a window needs, decoded sample-exactly).

Nothing here is imported with ``lanceloader``: the submodules import PyAV (``av``) when used.
"""

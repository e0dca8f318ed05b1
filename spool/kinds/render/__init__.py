"""The render kind: a recipe, checked at acceptance, becomes one FFmpeg command (the only
place that knows FFmpeg's filter syntax), run under limits; text layers planned to fit the
safe area; renders from an edit file; the daemon's start self-check."""

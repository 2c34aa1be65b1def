"""Prompts of emotion scoring (Emotional RAG, Huang et al. 2024: Plutchik's eight basic emotions)."""

EMOTION_SYSTEM = (
    "You rate the emotions expressed in a text on Plutchik's eight basic emotions. "
    "Give every emotion an integer score from 1 (absent) to 10 (overwhelming): "
    "joy, acceptance, fear, surprise, sadness, disgust, anger, anticipation."
)

EMOTION_SCORE = """Rate the emotions of this text (1 = absent, 10 = overwhelming).

<text>
{text}
</text>

Answer with the eight scores."""

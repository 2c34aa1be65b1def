"""Prompts of the InCharacter personality assessment (expert rating of interview answers, per dimension).

Following InCharacter (Wang et al., ACL 2024, github Neph0s/InCharacter): a
psychometrics expert reads a batch of 3-4 interview exchanges on one
dimension, with that dimension's description from the questionnaire, and
gives a score; anonymous mode hides the names (``<the participant>``,
``<the experimenter>``) so the evaluator judges what was said, not a famous
character it knows.
"""

from __future__ import annotations

ASSESS_BACKGROUND = """You are an expert in Psychometrics, especially {questionnaire}. I am conducting the {questionnaire} test \
on someone. I am gauging his/her position on the {dimension} dimension through a series of open-ended questions. For \
clarity, here's some background on this particular dimension:
===
{description}
===

My name is <the experimenter>. I've invited a participant, <the participant>, and we had many conversations in English. \
I will input the conversations.

Please help me assess <the participant>'s score within the {dimension} dimension of {questionnaire}.
"""

ONE_SCORE_OUTPUT = """You should provide the score of <the participant> in terms of {dimension}, which is a number between \
{low} and {high}. {low} denotes 'not {dimension} at all', {neutral} denotes 'neutral', and {high} denotes 'strongly \
{dimension}'. Other numbers in this range represent different degrees of '{dimension}'. You must give a score.
Please output in the following json format:
===
{{
    "analysis": <your analysis based on the conversations>,
    "result": <your score>
}}"""

TWO_SCORE_OUTPUT = """You should provide the percentage of each category, which sums to 100%, e.g., 30% A and 70% B.
Please output in the following json format:
===
{{
    "analysis": <your analysis based on the conversations>,
    "result": {{ "{first}": <percentage 1>, "{second}": <percentage 2> }} (the two percentages sum to 100)
}}"""

CONVERSATIONS = "Our conversation is as follows:\n{conversations}\n"
EXCHANGE = "{index}.\n<the experimenter>: 「{question}」\n<the participant>: 「{answer}」"

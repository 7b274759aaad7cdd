"""Environments for the agent-run tests (loaded by import path and by file path, as a user's would be)."""

from dapo_jax.agents.env import Env, StepResult, ToolEnv


class Retry(Env):
    """One sum per episode; after a wrong first answer a `check` tool says "no," and the model answers again.
    Turn reward 0.5 on a right answer; the outcome is whether the last answer was right."""

    def reset(self, row):
        self.answer, self.turns, self.right = str(row["answer"]), 0, False
        return [{"role": "user", "content": f"{row['problem']}="}]

    def step(self, turn):
        self.turns += 1
        self.right = turn.text.replace("<|endoftext|>", "").strip() == self.answer
        if self.right or self.turns >= 2:
            return StepResult([], reward=0.5 * self.right, done=True)
        return StepResult([{"role": "tool", "name": "check", "content": "no,"}], metrics={"tool_calls": 1.0})

    def reward(self):
        return float(self.right)


class BadReset(Env):
    """Fails on the first row: what the pre-flight check must name before the model loads."""

    def reset(self, row):
        raise KeyError("question")

    def step(self, turn):
        return StepResult([], done=True)


def echo(text: str) -> str:
    """Returns its argument.

    Args:
      text: anything.
    """
    return text


class Echo(ToolEnv):
    """A tool environment that sets no tool_timeout of its own (agent.tool_timeout applies)."""

    tools = (echo,)

    def reset(self, row):
        return [{"role": "user", "content": f"{row['problem']}="}]

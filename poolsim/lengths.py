"""Prompt and output lengths of LLM requests, per kind of deployment (chat, code).

Each length is log-normal, fitted to the median and interquartile range of
the Azure LLM inference traces of 2023 (Patel et al., "Splitwise", ISCA'24;
github.com/Azure/AzurePublicDataset, AzureLLMInferenceTrace_{code,conv}.csv,
8,819 code and 19,366 conversation requests, read for this fit):

              prompt tokens (q25/median/q75)    output tokens (q25/median/q75)
  code        578 / 1469 / 2745                 9 / 13 / 24
  chat        396 / 1020 / 1189                 85 / 129 / 395

  sigma = ln(q75 / q25) / 1.349 (the normal's interquartile range):
  code        median 1469, sigma 1.155          median 13, sigma 0.727
  chat        median 1020, sigma 0.815          median 129, sigma 1.139

A log-normal matches the median and the ratio q75 / q25 but not each
quartile where the trace is lopsided: chat prompts come out 588 / 1020 /
1770, the trace's mass sitting just above its median. Log-normal keeps the
heavy right tail that BurstGPT (Wang et al. 2024)
describes as Zipf-like in request tokens; its 95th percentiles come out
code prompt 9.8k (trace 7.3k), chat prompt 3.9k (4.1k), code output 43 (90),
chat output 840 (450). Prompt and output are drawn independently: the
correlation of their logarithms in the traces is -0.005 (code) and 0.09
(chat). Both are clipped to [1, max].
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from poolsim.workload import Kind

IQR_IN_SIGMAS = 1.349            # q75 - q25 of the standard normal


@dataclass(frozen=True, slots=True)
class LengthModel:
    """Log-normal prompt and output lengths: medians in tokens, sigmas of ln(tokens)."""
    prompt_median: float
    prompt_sigma: float
    output_median: float
    output_sigma: float
    max_prompt_tokens: int = 32_768
    max_output_tokens: int = 4_096


def sigma_from_quartiles(q25: float, q75: float) -> float:
    return math.log(q75 / q25) / IQR_IN_SIGMAS


CODE = LengthModel(prompt_median=1469, prompt_sigma=sigma_from_quartiles(578, 2745),
                   output_median=13, output_sigma=sigma_from_quartiles(9, 24))
CHAT = LengthModel(prompt_median=1020, prompt_sigma=sigma_from_quartiles(396, 1189),
                   output_median=129, output_sigma=sigma_from_quartiles(85, 395))
LENGTHS: dict[Kind, LengthModel] = {"chat": CHAT, "code": CODE}


def draw_lengths(rng: np.random.Generator, model: LengthModel, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(prompt_tokens, output_tokens), each int64 [n]."""
    prompts = _log_normal(rng, model.prompt_median, model.prompt_sigma, model.max_prompt_tokens, n)
    outputs = _log_normal(rng, model.output_median, model.output_sigma, model.max_output_tokens, n)
    return prompts, outputs


def _log_normal(rng: np.random.Generator, median: float, sigma: float, most: int, n: int) -> np.ndarray:
    values = rng.lognormal(math.log(median), sigma, n)
    return np.clip(np.rint(values), 1, most).astype(np.int64)

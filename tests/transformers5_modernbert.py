"""transformers 5's PyTorch ModernBERT, the reference mlm_pipeline/modernbert.py must match.

Runs in .venv-transformers5 (transformers 5 has no TF models), once per session of
tests/test_modernbert.py, which starts it after writing the TF side's folders, so one process does
all the PyTorch work in both directions (and once for tests/test_continued_pretraining.py, whose
ModernBERT parent it makes and scores):

    .venv-transformers5/bin/python tests/transformers5_modernbert.py request.json report.json

request.json holds
- "input_ids" and "attention_mask": the padded batch every model is run on (none: no outputs
  are saved);
- "build": [{"folder", "kind" ("masked_lm" or "classifier"), "config" (ModernBertConfig keyword
  arguments), "seed"}]: a random model is made with the seed, every weight moved off its
  initial value (so that biases and norm weights, initialized to 0 and 1, are checked too), and
  saved with save_pretrained (model.safetensors, config.json); an entry with "input_ids" and
  "attention_mask" of its own is run on those in place of the shared batch (a long sequence);
- "load": [{"folder", "kind"}]: a folder the TF side wrote, loaded with AutoModelFor...;
- "configs": [folder]: config.json files to read only;
- "losses": [{"folder", "batches"}]: a masked LM folder loaded with AutoModelForMaskedLM, and an
  .npz of masked batches ("input_ids" and "labels", [batches, batch, length], -100 where nothing
  is predicted), scored without an attention mask (every token attends, as run_mlm.py's model
  does): the mean cross-entropy of each batch's labelled positions.

Each model's logits (float32, eval mode, eager attention: its additive mask is the one the TF
side reproduces, padded rows included) go to <folder>/transformers5_logits.npy, a masked LM's
last hidden state to <folder>/transformers5_hidden.npy. report.json: the versions, for every
folder the class, loading info and how transformers 5 reads its config (layer types, RoPE
thetas, window), and the losses by folder.
"""

import json
import sys


def config_reading(config):
    """What transformers 5 makes of a config: the fields the attention depends on."""
    return {
        "layer_types": list(config.layer_types),
        "rope_thetas": {
            layer_type: parameters["rope_theta"]
            for layer_type, parameters in config.rope_parameters.items()
        },
        "local_attention": config.local_attention,
        "tie_word_embeddings": config.tie_word_embeddings,
        "classifier_pooling": config.classifier_pooling,
    }


def model_class(kind):
    from transformers import AutoModelForMaskedLM, AutoModelForSequenceClassification

    return {"masked_lm": AutoModelForMaskedLM, "classifier": AutoModelForSequenceClassification}[
        kind
    ]


def save_outputs(model, folder, batch):
    import numpy as np
    import torch

    if batch is None:
        return
    model.eval()
    with torch.no_grad():
        outputs = model(**batch, output_hidden_states=True)
    np.save(f"{folder}/transformers5_logits.npy", outputs.logits.float().numpy())
    if hasattr(model, "decoder"):
        np.save(f"{folder}/transformers5_hidden.npy", outputs.hidden_states[-1].float().numpy())


def own_batch(entry, batch):
    """The entry's own batch if it has one, else the shared one."""
    import torch

    if "input_ids" not in entry:
        return batch
    return {name: torch.tensor(entry[name]) for name in ("input_ids", "attention_mask")}


def build(entry, batch):
    import torch
    from transformers import ModernBertConfig

    config = ModernBertConfig(**entry["config"])
    torch.manual_seed(entry["seed"])
    model = model_class(entry["kind"]).from_config(config, attn_implementation="eager")
    with torch.no_grad():
        for parameter in model.parameters():  # tied ones once: parameters() skips repeats
            parameter.add_(0.05 * torch.randn_like(parameter))
    model.save_pretrained(entry["folder"])
    save_outputs(model, entry["folder"], own_batch(entry, batch))
    return {"model_class": type(model).__name__, **config_reading(model.config)}


def load(entry, batch):
    model, loading_info = model_class(entry["kind"]).from_pretrained(
        entry["folder"], attn_implementation="eager", output_loading_info=True
    )
    save_outputs(model, entry["folder"], batch)
    return {
        "model_class": type(model).__name__,
        "loading_info": {key: sorted(map(str, value)) for key, value in loading_info.items()},
        "shares_word_embeddings": model.config.tie_word_embeddings
        and hasattr(model, "decoder")
        and model.decoder.weight.data_ptr()
        == model.model.embeddings.tok_embeddings.weight.data_ptr(),
        **config_reading(model.config),
    }


def losses(entry):
    """Each batch's loss, as transformers 5 computes it from the labels."""
    import numpy as np
    import torch

    model = model_class("masked_lm").from_pretrained(entry["folder"], attn_implementation="eager")
    model.eval()
    batches = np.load(entry["batches"])
    found = []
    with torch.no_grad():
        for input_ids, labels in zip(batches["input_ids"], batches["labels"], strict=True):
            output = model(input_ids=torch.tensor(input_ids), labels=torch.tensor(labels))
            found.append(float(output.loss))
    return found


def main(request_path, report_path):
    import torch
    import transformers
    from transformers import AutoConfig

    torch.set_num_threads(1)  # tiny models: threads cost more than they give on 2 shared cores
    with open(request_path, encoding="utf-8") as file:
        request = json.load(file)
    batch = None
    if "input_ids" in request:
        batch = {
            "input_ids": torch.tensor(request["input_ids"]),
            "attention_mask": torch.tensor(request["attention_mask"]),
        }
    report = {
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "build": {entry["folder"]: build(entry, batch) for entry in request["build"]},
        "load": {entry["folder"]: load(entry, batch) for entry in request["load"]},
        "configs": {
            folder: config_reading(AutoConfig.from_pretrained(folder))
            for folder in request["configs"]
        },
        "losses": {entry["folder"]: losses(entry) for entry in request.get("losses", [])},
    }
    with open(report_path, "w", encoding="utf-8") as file:
        json.dump(report, file, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:])

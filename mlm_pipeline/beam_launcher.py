"""prepare_tfrecord_shards.py --runner: the launcher's side of the Apache Beam pipeline.

The pipeline itself, what the workers run, is beam_pipeline.py. Here is what the machine you type on
does around it: refuse, before any work, a missing Apache Beam, pipeline options Beam does not
know, a runner it cannot make, a Dataflow job whose workers could not reach its files, and a
tokenizer the workers would load differently; set up the runner; run the pipeline to its end; and
turn a failure on a worker into the one line the user needs.

Apache Beam is an install of its own (requirements-beam.txt): the steps on one machine need none of
it, so nothing here imports it before `require_beam()` has checked that it is there.
"""

import logging
import os
import re

from . import split_folder
from .errors import UsageError
from .storage import is_local_path
from .tf_startup import stderr_held_back

DATAFLOW = "DataflowRunner"
INSTALL_BEAM = "pip install -r requirements-beam.txt"
# the folder holding mlm_pipeline/
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def require_beam():
    """Refuse --runner in one line when Apache Beam is not installed."""
    try:
        import apache_beam  # noqa: F401
    except ImportError:
        raise UsageError(
            "--runner runs the step as an Apache Beam pipeline, and Apache Beam is not "
            f"installed; install it with `{INSTALL_BEAM}`, or run without --runner."
        ) from None


def check_options(beam_argv, *, tokenizer, output_dir, inputs):
    """Refuse, in one line, pipeline options Beam does not know, a runner it cannot make, and a
    Dataflow job whose workers could not reach its files or import this package. `inputs` lists
    each input flag with its value."""
    require_beam()
    from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
    from apache_beam.runners.runner import create_runner

    quiet_beam()
    options = PipelineOptions(beam_argv)
    unknown = unknown_options(options)
    if unknown:
        raise UsageError(
            f"{unknown[0]} is neither a flag of this script nor a Beam pipeline option; check its "
            "spelling (see --help, and the Beam pipeline options in docs/reference.md)."
        )
    runner = options.view_as(StandardOptions).runner
    try:
        runner_class = type(create_runner(runner)).__name__
    except (ValueError, ImportError, AttributeError) as error:
        known = ", ".join(StandardOptions.KNOWN_RUNNER_NAMES)
        raise UsageError(
            f"--runner {runner} is not a Beam runner ({type(error).__name__}); use one of {known}."
        ) from None
    if runner_class == DATAFLOW:
        check_dataflow(options, tokenizer=tokenizer, output_dir=output_dir, inputs=inputs)


def quiet_beam():
    """Beam logs its workers' warnings, and every failure with its traceback, before the launcher
    can report it in one line (or re-raise what is no UsageError, with its own traceback)."""
    logging.getLogger("apache_beam").setLevel(logging.CRITICAL)


def unknown_options(options):
    """The flags in `options` that no Beam PipelineOptions class defines."""
    known = options.get_all_options(retain_unknown_options=False)
    every = options.get_all_options(retain_unknown_options=True)
    return [f"--{name}" for name in every if name not in known]


def check_dataflow(options, *, tokenizer, output_dir, inputs):
    """Dataflow's workers are other machines: every path they read or write must be gs://, and they
    must be able to import this package."""
    from apache_beam.options.pipeline_options import GoogleCloudOptions, SetupOptions, WorkerOptions

    cloud = options.view_as(GoogleCloudOptions)
    if not (cloud.temp_location or "").startswith("gs://"):
        raise UsageError(
            "--runner DataflowRunner needs --temp_location gs://BUCKET/tmp (where Dataflow stages "
            "files and keeps temporary ones); pass it, with --project and --region."
        )
    for flag, path in [("--output_dir", output_dir), *inputs]:
        if not path.startswith("gs://"):
            raise UsageError(
                f"{flag} {path} is on this machine, which Dataflow's workers cannot read or write; "
                "put it in Cloud Storage (gs://...) and pass that path."
            )
    if is_local_path(tokenizer):
        raise UsageError(
            f"--tokenizer_name_or_path {tokenizer} is a folder on this machine, which Dataflow's "
            f"workers cannot read; copy it to Cloud Storage (gsutil cp -r {tokenizer} "
            "gs://BUCKET/tokenizer) or push it to the Hub, and pass that."
        )
    setup = options.view_as(SetupOptions)
    if not (setup.setup_file or options.view_as(WorkerOptions).sdk_container_image):
        raise UsageError(
            "--runner DataflowRunner needs the workers to have this package: pass --setup_file "
            "./setup.py (or an --sdk_container_image with it installed)."
        )


def worker_tokenizer(name, *, backend, split_special_tokens):
    """The tokenizer as the workers will load it (beam_pipeline.WorkerTokenizer), loaded here the
    workers' way once, so that a tokenizer they could not load, or would load differently, is
    refused before any work."""
    from . import beam_pipeline

    fingerprint = split_folder.tokenizer_fingerprint(backend)
    tokenizer = beam_pipeline.WorkerTokenizer(name, split_special_tokens, fingerprint)
    beam_pipeline.load_backend(tokenizer)
    return tokenizer


def run(
    beam_argv,
    files,
    *,
    tokenizer,
    settings,
    split_dir,
    batch_size,
    limit,
    text_column,
    packing_text,
):
    """Build the pipeline (beam_pipeline.build) and run it to its end on the runner of `beam_argv`.
    A failure anywhere (a worker, a bad line of input) raises, as a UsageError where the cause was
    one."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from . import beam_pipeline

    options = PipelineOptions(beam_argv)
    runner, local = runner_for(options)
    pipeline = beam.Pipeline(runner=runner, options=options)
    beam_pipeline.build(
        pipeline,
        files,
        settings=settings,
        tokenizer=tokenizer,
        split_dir=split_dir,
        batch_size=batch_size,
        limit=limit,
        text_column=text_column,
        packing_text=packing_text,
    )
    # Beam's local worker processes print every failure's traceback to the stderr they share with
    # this one: held back, it is shown only when the failure is not the user's input.
    with stderr_held_back(
        active=local,
        name="beam-workers",
        title="the Beam workers' log",
        during="the Beam pipeline's run",
    ):
        try:
            pipeline.run().wait_until_finish()
        except Exception as error:
            # the runner wraps what a worker raised; a UsageError's sentence is in its text
            found = re.search(r"UsageError: (.+)", str(error))
            if found:
                raise UsageError(found.group(1).strip()) from None
            raise


def runner_for(options):
    """The runner to hand beam.Pipeline (None: the one the options name), and whether its workers
    run on this machine."""
    from apache_beam.options.pipeline_options import StandardOptions

    if options.view_as(StandardOptions).runner.lower() not in ("directrunner", "direct"):
        # Logged: a remote runner's progress, and where to watch the job (Dataflow's console link).
        logging.getLogger().setLevel(logging.INFO)
        return None, False
    # What the DirectRunner runs a batch pipeline on, named directly: the DirectRunner would first
    # try the PrismRunner, which downloads a binary at start-up, so an offline machine would wait
    # for it to fail.
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner

    # Worker processes (--direct_running_mode multi_processing) import this package too, and talk
    # to this one over gRPC on loopback, which must not go through an HTTPS_PROXY set for Cloud
    # Storage.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [PACKAGE_ROOT, os.environ.get("PYTHONPATH")])
    )
    os.environ["no_grpc_proxy"] = ",".join(
        filter(None, [os.environ.get("no_grpc_proxy"), "localhost,127.0.0.1"])
    )
    quiet_beam()
    return FnApiRunner(), True

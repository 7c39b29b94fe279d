"""Test setup: several fake CPU devices (set before JAX is imported) and a --runslow flag."""

import os

# Multi-device code must run everywhere: give the host CPU 4 virtual devices.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The CLI turns JAX's persistent compilation cache on (simplace.compile_cache): tests run
# it in process, so it would change JAX's configuration for every later test. Off here;
# tests/test_compile_cache.py checks it in subprocesses.
os.environ["SIMPLACE_COMPILE_CACHE"] = "off"

import warnings  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def mlp_graph():
    """The small mlp's training graph (78 ops), traced once per worker."""
    from simplace import trace, zoo

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fn, args = zoo.get("mlp", small=True, abstract=True, training=True)
        return trace(fn, *args, name="mlp")


@pytest.fixture(autouse=True, scope="session")
def _fresh_user_dir(tmp_path_factory):
    """Tests neither read nor write the user's own calibrations (simplace.paths): the user
    directory is an empty temporary one (subprocesses inherit it)."""
    old = os.environ.get("SIMPLACE_HOME")
    os.environ["SIMPLACE_HOME"] = str(tmp_path_factory.mktemp("simplace_home"))
    yield
    if old is None:
        os.environ.pop("SIMPLACE_HOME", None)
    else:
        os.environ["SIMPLACE_HOME"] = old


@pytest.fixture
def pricings(monkeypatch):
    """The list that grows by one each time a graph is priced into SimInputs
    (``make_sim_inputs``): what the tests of "price once" count."""
    import simplace.sim.inputs as inputs

    built = []
    real = inputs.make_sim_inputs
    monkeypatch.setattr(inputs, "make_sim_inputs",
                        lambda *a, **kw: built.append(1) or real(*a, **kw))
    return built



@pytest.fixture(scope="module")
def nmt():
    """nmt_2layer's small training step, traced (the placers' tests' graph)."""
    import simplace
    from simplace import zoo

    fn, args = zoo.get("nmt_2layer", small=True)
    return simplace.trace(fn, *args, name="nmt_2layer")


@pytest.fixture(scope="module")
def k40x4():
    """The Haswell + 4 K40 datasheet machine."""
    import simplace

    return simplace.CostModel.load("haswell_k40x4")


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", help="run tests marked slow")


# Heavy cases of behaviours that keep a lighter case in the default run (the README's test
# command must finish within 5 minutes on 2 cores). They are marked slow here, in one list,
# and run with --runslow (CI runs them in a step of its own). Each entry's lighter sibling
# is named in the comment; an entry that no longer matches a test of a collected file is an
# error, so the list cannot rot silently.
HEAVY = {
    # random-DAG agreement: seed [0] stays
    "tests/test_sim.py::test_batched_matches_reference_on_random_graphs[1]",
    # zoo agreement: mlp stays (and the random-DAG cases)
    "tests/test_sim_zoo.py::test_batched_matches_reference_on_zoo_graphs[nmt_2layer-haswell_k40x2]",
    "tests/test_sim_zoo.py::test_batched_matches_reference_on_zoo_graphs[transformer-placeto_k80x2]",
    "tests/test_sim_zoo.py::test_batched_matches_reference_on_zoo_graphs[resnet50-cpu_h100x4_nvlink]",
    # policies: gnn stays for each
    "tests/test_rl.py::test_gradients_finite_and_update_moves_params[seq2seq]",
    "tests/test_rl.py::test_gradients_finite_and_update_moves_params[hierarchical]",
    "tests/test_rl.py::test_policy_reaches_oracle_optimum_and_learns[seq2seq]",
    "tests/test_rl.py::test_policy_reaches_oracle_optimum_and_learns[hierarchical]",
    # OOM handling: bound stays
    "tests/test_rl.py::test_oom_samples_never_become_best[exact-jax]",
    # small models trace and run: one model per family stays (resnet50-infer, nmt_2layer,
    # transformer-train, bert_base, alexnet, rnnlm, mlp, tiny_cnn)
    "tests/test_zoo.py::test_small_model_traces_and_runs[inception_v3-train]",
    "tests/test_zoo.py::test_small_model_traces_and_runs[inception_v3-infer]",
    "tests/test_zoo.py::test_small_model_traces_and_runs[resnet50-train]",
    "tests/test_zoo.py::test_small_model_traces_and_runs[nmt_4layer-train]",
    "tests/test_zoo.py::test_small_model_traces_and_runs[nmt_8layer-train]",
    "tests/test_zoo.py::test_small_model_traces_and_runs[nmt_8layer-infer]",
    "tests/test_zoo.py::test_small_model_traces_and_runs[bert_large-train]",
    "tests/test_zoo.py::test_small_model_traces_and_runs[transformer-infer]",
    # paper sizes traced abstractly: resnet50, rnnlm, nmt_2layer, alexnet... stay
    "tests/test_zoo.py::test_default_size_traces_abstractly[nmt_4layer]",
    "tests/test_zoo.py::test_default_size_traces_abstractly[nmt_8layer]",
    "tests/test_zoo.py::test_default_size_traces_abstractly[inception_v3]",
    "tests/test_zoo.py::test_default_size_traces_abstractly[bert_large]",
    "tests/test_zoo.py::test_default_size_traces_abstractly[transformer]",
    # module paths of inception stay in test_module_paths
    "tests/test_zoo.py::test_inception_aux_head",
    # the placed program gives the original outputs: the smaller models stay
    "tests/test_execute.py::test_apply_gives_original_outputs_inference[inception_v3]",
    "tests/test_execute.py::test_apply_gives_original_outputs_inference[resnet50]",
    "tests/test_execute.py::test_apply_gives_original_outputs_inference[nmt_8layer]",
    "tests/test_execute.py::test_apply_gives_original_outputs_inference[bert_large]",
    "tests/test_execute.py::test_apply_gives_original_outputs_inference[nmt_4layer]",
    # both trace modes: the other models stay
    "tests/test_zoo_graphs.py::test_traces_in_both_modes[inception_v3-True]",
    "tests/test_zoo_graphs.py::test_traces_in_both_modes[inception_v3-False]",
    # sharded = unsharded: alexnet-2-expert and mlp-4-pase stay
    "tests/test_parallel_sharding.py::test_sharded_execution_matches_unsharded[transformer-4-expert]",
    # --method all with every method (rl-* compile): test_compare_shares_its_budget stays
    "tests/test_placers.py::test_all_returns_the_best_fitting_result",
    # local search on tight memory: [False] stays; brute-force optimum: the smaller cases stay
    "tests/test_local_exact.py::test_local_returns_fitting_placement_on_tight_memory[auto]",
    "tests/test_local_exact.py::test_local_screened_finds_brute_force_optimum[21]",
    "tests/test_local_exact.py::test_local_finds_brute_force_optimum[4-17]",
    "tests/test_local_exact.py::test_local_finds_brute_force_optimum[3-14]",
    # --- second cut (the suite grew by 250 cases this session) ---
    "tests/test_sim_zoo.py::test_batched_matches_reference_on_zoo_graphs[tiny_cnn-haswell_k40x4]",
    "tests/test_local_exact.py::test_local_finds_brute_force_optimum[1-11]",
    "tests/test_local_exact.py::test_local_finds_brute_force_optimum[2-12]",
    "tests/test_zoo.py::test_small_model_traces_and_runs[resnet50-infer]",
    "tests/test_zoo.py::test_small_model_traces_and_runs[bert_large-infer]",
    "tests/test_zoo.py::test_small_model_traces_and_runs[nmt_4layer-infer]",
    "tests/test_zoo.py::test_small_model_traces_and_runs[bert_base-infer]",
    "tests/test_zoo.py::test_small_model_traces_and_runs[alexnet-infer]",
    "tests/test_zoo.py::test_default_size_traces_abstractly[resnet50]",
    "tests/test_zoo.py::test_default_size_traces_abstractly[bert_base]",
    "tests/test_execute.py::test_apply_gives_original_outputs_inference[transformer]",
    "tests/test_execute.py::test_apply_gives_original_outputs_inference[nmt_2layer]",
    "tests/test_execute.py::test_apply_gives_original_outputs_inference[bert_base]",
    "tests/test_zoo_graphs.py::test_traces_in_both_modes[resnet50-True]",
    "tests/test_zoo_graphs.py::test_traces_in_both_modes[bert_large-True]",
    "tests/test_zoo_graphs.py::test_traces_in_both_modes[bert_large-False]",
    "tests/test_zoo_graphs.py::test_traces_in_both_modes[nmt_8layer-True]",
    "tests/test_zoo_graphs.py::test_traces_in_both_modes[nmt_8layer-False]",
    "tests/test_zoo_graphs.py::test_quotients_stay_acyclic_and_keep_cost[nmt_8layer-True]",
    "tests/test_zoo_graphs.py::test_quotients_stay_acyclic_and_keep_cost[bert_large-True]",
    # --- third cut (the README's command took 4 min 32 s on 2 cores, 2026-11-23): the
    # four slowest cases, 20-42 s each (RL compiles policies; the chunked-batch test
    # compiles the JAX simulator at several batch sizes). RL's warm start, hook and plot
    # stay (test_warm_start_hook_history_and_plot), as do the batched = reference cases.
    "tests/test_rl.py::test_deterministic_and_checkpoint_resume_equals_uninterrupted_run",
    "tests/test_sim.py::test_chunked_batches_give_the_results_of_one_run",
    "tests/test_rl.py::test_hook_returning_a_corrected_cost_model_is_trained_against",
    "tests/test_rl.py::test_auto_oom_mode_picks_exact_when_memory_is_tight",
    # --- fourth cut (the README's command took 5 min 20-44 s on this session's 2 cores,
    # 2026-11-24, a host about 1.5x slower than the last one): cases with a sibling.
    # build_cost_model's determinism covers the segment fit's
    "tests/test_calibrate_segments.py::test_fit_segments_is_deterministic",
    # refit = build: test_calibrate_e2e.py::test_refit_of_synthetic_records stays
    "tests/test_calibrate.py::test_refit_reproduces_the_model_from_records",
    # links that do not grow are refused: test_build_refuses_a_link_that_does_not_grow...
    "tests/test_calibrate.py::test_build_raises_only_when_no_link_fits",
    # links from timed copies: test_build_links_from_the_copy_time_after_the_call stays
    "tests/test_calibrate.py::test_build_links_take_their_latency_from_copies_in_context",
    # unseen rates: test_fit_segments_leaves_unseen_classes_at_their_defaults stays
    "tests/test_calibrate_segments.py::test_fit_segments_names_rates_the_segments_cannot_see",
    # the segment fit predicts fresh segments: test_fit_segments_predicts_held_out_segments
    "tests/test_calibrate_segments.py::test_fit_segments_uses_a_base_per_segment",
    # the worker-thread launch paid by threshold: test_calibrate_fit.py's
    # test_fit_device_recovers_the_wake_up_of_segments_whose_ops_wake_the_thread... stays
    "tests/test_calibrate_segments.py::test_fit_device_pays_parallel_launch_by_threshold_and_reports_held_out_errors",
    # batched = reference: the random-DAG case [0] stays
    "tests/test_sim.py::test_batched_matches_reference_with_ties_and_long_segments",
    # policies: seq2seq stays for each
    "tests/test_rl_policies.py::test_imitation_puts_the_policy_on_the_warm_start_and_scores_it[hierarchical]",
    "tests/test_rl_policies.py::test_initial_parameters_are_flax_trees_drawn_with_numpy[hierarchical]",
    # OOM handling: bound-numba stays
    "tests/test_rl.py::test_oom_samples_never_become_best[bound-jax]",
    # training outputs of the placed program: alexnet, tiny_cnn, mlp stay
    "tests/test_execute.py::test_apply_gives_original_outputs_training[rnnlm]",
    # --- fifth cut (the README's command took 4 min 28 s here after the pretrained
    # policy, ideals and the scales landed, 2026-11-27): calibrate --quick end to end,
    # interrupted and resumed (32 s); the refit of records stays
    # (test_calibrate_e2e.py::test_refit_of_synthetic_records), as do the step and
    # segment fits' own tests
    "tests/test_calibrate_e2e.py::test_quick_interrupted_resumed_and_refit",
    # --- sixth cut (4 min 14 s here, 2026-11-28, on a VM ~20% slower than the morning's
    # 4 min 2 s with the same tests): training over many problems seeded, resumed and
    # learning (14 s); train-policy's own test still trains, continues from weights and
    # writes the card (test_train_policy_command_writes_weights_and_refuses_no_budget)
    "tests/test_pretrained.py::test_training_is_seeded_resumable_and_learns",
    # --- seventh cut (4 min 26 s on a quiet VM, 2026-11-28): cases with a sibling that
    # stays. RL's update on the gnn policy: test_policy_reaches_oracle_optimum_and_learns
    # [gnn] trains it (the exact memory path runs in the slow step)
    "tests/test_rl.py::test_gradients_finite_and_update_moves_params[gnn]",
    # pricing once: test_calibrate_prices_once.py's build case stays
    "tests/test_validate_prices_once.py::test_a_validation_of_a_corrected_model_prices_its_graph_once",
    # inception_v3's graph: the other zoo models stay for each
    "tests/test_zoo_graphs.py::test_quotients_stay_acyclic_and_keep_cost[inception_v3-True]",
    "tests/test_zoo.py::test_no_loops_in_any_model[inception_v3]",
    # training outputs: mlp and tiny_cnn stay; paper sizes: nmt_2layer, alexnet... stay
    "tests/test_execute.py::test_apply_gives_original_outputs_training[alexnet]",
    "tests/test_zoo.py::test_default_size_traces_abstractly[rnnlm]",
    # (the same cases took 4 min 22 s on a quiet VM later the same day: its pace varies
    # by a tenth) rl-universal without a budget: its budgeted case stays
    # (test_rl_universal_under_a_budget_searches_from_the_fine_tuned_placement); the
    # validate command: the Python API's case stays (test_validate_reports_every_
    # candidate_and_writes_records), as does optimize --validate's
    "tests/test_pretrained.py::test_rl_universal_fine_tunes_from_the_pretrained_start",
    "tests/test_validate.py::test_validate_cli",
    # --- eighth cut (4 min 14-31 s on this session's VM, 2026-11-29, with 3 min 41-50 s for
    # nearly the same tests the day before): the cost-model build's determinism and its
    # handling of repeated measurements (9.5 s; the build's own fits stay)
    "tests/test_calibrate.py::test_build_is_deterministic_and_takes_the_last_of_repeated_measurements",
}


@pytest.hookimpl(tryfirst=True)  # before -m selects by marker
def pytest_collection_modifyitems(config, items):
    ids = {item.nodeid for item in items}
    files = {nodeid.split("::")[0] for nodeid in ids}
    stale = sorted(h for h in HEAVY if h.split("::")[0] in files and h not in ids)
    # Only a run that collects whole files can tell (not -k, -m, --lf or file::test).
    whole_files = not (config.getoption("-k") or config.getoption("-m")
                       or config.getoption("lf", False) or config.getoption("deselect", None)
                       or any("::" in str(a) for a in config.args))
    if stale and whole_files:
        raise pytest.UsageError(
            "tests/conftest.py HEAVY names tests that no longer exist (rename or remove "
            "them there): " + ", ".join(stale))
    for item in items:
        if item.nodeid in HEAVY:
            item.add_marker(pytest.mark.slow)
    if config.getoption("--runslow"):
        return
    skip = pytest.mark.skip(reason="slow: run with --runslow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)

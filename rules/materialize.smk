# The output is the step report, not .materialized: without its marker a teacher directory is foreign
# to materialize, which would then refuse it for good (and could not tell another request's teacher).
rule materialize:
    input:
        get_teacher_input,
    output:
        report=f"{REPORTS}/materialize/{{run}}/{{iteration}}.json",
    log:
        f"{LOGS}/materialize/{{run}}/{{iteration}}.log",
    conda:
        "../environment.yml"
    params:
        base=config["base"],
        ckpt_dir=get_teacher_ckpt_dir,
        artifact_uri=get_teacher_uri,
        stage_root=get_stage_root,
        out=get_teacher_out,
        options=config["materialize"],
    script:
        "../scripts/materialize.py"


rule materialize_teacher:
    input:
        get_teacher_target,

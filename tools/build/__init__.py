"""Build: a task's sources into lib<task>.so with ninja, and which objects of an earlier build a new one
may link.

Entry points:
- build.build(task, build_dir) -> BuildResult (ninja over the backend's compile and link lines,
  ptxas' resources per kernel); build.default_build_dir(task); `python -m tools.build` (__main__).
- reuse.latest_builds, reusable_from, reusable_halves: which objects of earlier builds a new one
  links (the binding compiled once per sweep, per machine).
- objcache.lookup, store: the machine's object cache, keyed on what each compile read (the same bytes built in
  another folder or repository are linked, not compiled).
- output.parse_ptxas, first_errors: what the compilers print, read.
- commands.build_commands(task): each compile and link command a build would run, without building (what the
  model is told of the build).
- scan.scan_task, scan_expanded: the source scan before a build (what no kernel needs, the line quoted), on the text
  as written and on the text as compiled; expand.expand(task): the editable sources as the compiler reads them (the
  compile commands with -E, nvcc's host and device passes, the user's lines by their line markers).

May import: the task (tools.task) and the floors below it (tools.backends, tools.isolation, tools.results).
"""

{{/* ---- the DRA mode (ours) ------------------------------------------------------------------------------------ */}}

{{/* "true" when the plugin may serve DRA: dra.enabled, or a config in config.map that turns it on (a ConfigMap
named by config.name is not assumed to: DRA's rights are cluster-wide writes, so they are asked for by value). */}}
{{- define "nvdp.mayUseDra" -}}
{{- if eq (toString .Values.dra.enabled) "true" -}}true
{{- else -}}
{{- range $name, $text := .Values.config.map -}}
{{- if eq (toString (dig "dra" "enabled" false (fromYaml $text))) "true" -}}true{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* dra.gpus as NVDP_DRA_GPUS takes it: "all", or the indices and UUIDs comma-joined; empty when unset. */}}
{{- define "nvdp.draGpus" -}}
{{- $gpus := .Values.dra.gpus -}}
{{- if kindIs "slice" $gpus -}}
{{- join "," $gpus -}}
{{- else if not (kindIs "invalid" $gpus) -}}
{{- toString $gpus -}}
{{- end -}}
{{- end -}}

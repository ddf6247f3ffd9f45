{{/* ---- what the configs may ask for ---------------------------------------------------------------------
With config.map the chart reads each config and knows; with config.name (a ConfigMap the chart cannot read) it
assumes the config may ask for anything. NVIDIA's chart assumes that for config.map too. */}}

{{- define "nvdp.hasConfig" -}}
{{- if or .Values.config.name (not (empty .Values.config.map)) -}}true{{- end -}}
{{- end -}}

{{- define "nvdp.configMapName" -}}
{{- if .Values.config.name -}}
{{- .Values.config.name -}}
{{- else if not (empty .Values.config.map) -}}
{{- include "nvdp.suffixed" (dict "root" . "suffix" "configs") -}}
{{- end -}}
{{- end -}}

{{/* The device-list strategies of the values and of every config in config.map, as one comma-joined string. */}}
{{- define "nvdp.listStrategies" -}}
{{- $found := list (toString (default "" .Values.deviceListStrategy)) -}}
{{- range $name, $text := .Values.config.map -}}
{{- $plugin := dig "flags" "plugin" dict (fromYaml $text) -}}
{{- $strategy := get $plugin "deviceListStrategy" -}}
{{- if kindIs "slice" $strategy -}}
{{- $found = concat $found $strategy -}}
{{- else if $strategy -}}
{{- $found = append $found (toString $strategy) -}}
{{- end -}}
{{- end -}}
{{- join "," $found -}}
{{- end -}}

{{/* "true" when some node may run a MIG strategy other than none. */}}
{{- define "nvdp.mayUseMig" -}}
{{- if .Values.migStrategy -}}
{{- if ne (toString .Values.migStrategy) "none" -}}true{{- end -}}
{{- else if .Values.config.name -}}true
{{- else -}}
{{- range $name, $text := .Values.config.map -}}
{{- $mig := dig "flags" "migStrategy" "none" (fromYaml $text) -}}
{{- if ne (toString $mig) "none" -}}true{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* "true" when some config may share GPUs through MPS. */}}
{{- define "nvdp.mayUseMps" -}}
{{- if .Values.config.name -}}true
{{- else -}}
{{- range $name, $text := .Values.config.map -}}
{{- if dig "sharing" "mps" "" (fromYaml $text) -}}true{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* "true" when a CDI device-list strategy may be used (the plugin then writes CDI specs). */}}
{{- define "nvdp.mayUseCdi" -}}
{{- if or .Values.config.name (contains "cdi" (include "nvdp.listStrategies" .)) -}}true{{- end -}}
{{- end -}}

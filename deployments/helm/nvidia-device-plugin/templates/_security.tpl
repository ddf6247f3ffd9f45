{{/* ---- security contexts and resources: a value set by the user is used as it is ------------------------ */}}

{{/* NVIDIA's rule: SYS_ADMIN (and NVIDIA_MIG_MONITOR_DEVICES) where MIG is possible or volume-mounts is used. */}}
{{- define "nvdp.needsSysAdmin" -}}
{{- if or (include "nvdp.mayUseMig" .) (contains "volume-mounts" (include "nvdp.listStrategies" .)) -}}true{{- end -}}
{{- end -}}

{{- define "nvdp.podSecurityContext" -}}
{{- if .Values.podSecurityContext -}}
{{ toYaml .Values.podSecurityContext }}
{{- else -}}
runAsUser: 0
runAsGroup: 0
runAsNonRoot: false
seccompProfile:
  type: RuntimeDefault
{{- end -}}
{{- end -}}

{{/* .context: the user's value; .root: the chart. */}}
{{- define "nvdp.containerSecurityContext" -}}
{{- if .context -}}
{{ toYaml .context }}
{{- else if .root.Values.compatWithCPUManager -}}
privileged: true
{{- else -}}
privileged: false
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
  {{- if include "nvdp.needsSysAdmin" .root }}
  add: ["SYS_ADMIN"]
  {{- end }}
{{- end -}}
{{- end -}}

{{- define "nvdp.resources" -}}
{{- if .value -}}
{{ toYaml .value }}
{{- else -}}
requests:
  cpu: {{ .cpu }}
  memory: {{ .memory }}
{{- with .limit }}
limits:
  memory: {{ . }}
{{- end }}
{{- end -}}
{{- end -}}

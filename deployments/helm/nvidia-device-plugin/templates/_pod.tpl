{{/* ---- pieces of the pod spec every DaemonSet shares ---------------------------------------------------------- */}}

{{- define "nvdp.podScheduling" -}}
{{- include "nvdp.podSchedulingWith" (dict "root" . "nodeSelector" dict) -}}
{{- end -}}

{{/* The pod's scheduling, with nodeSelector's labels added to .Values.nodeSelector. */}}
{{- define "nvdp.podSchedulingWith" -}}
{{- $root := .root -}}
{{- $nodeSelector := merge (deepCopy .nodeSelector) (default dict $root.Values.nodeSelector) -}}
{{- with $root.Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with $root.Values.runtimeClassName }}
runtimeClassName: {{ . }}
{{- end }}
{{- with $root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $root.Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $root.Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{- define "nvdp.hostNetwork" -}}
{{- if . }}
hostNetwork: true
dnsPolicy: ClusterFirstWithHostNet
{{- end }}
{{- end -}}

{{/* The NVIDIA flags that are set (typeIs: null means "leave it to the config"), as env entries. */}}
{{- define "nvdp.flagEnv" -}}
{{- $strings := dict "MIG_STRATEGY" .Values.migStrategy "DEVICE_LIST_STRATEGY" .Values.deviceListStrategy "DEVICE_ID_STRATEGY" .Values.deviceIDStrategy "NVIDIA_DEV_ROOT" .Values.nvidiaDevRoot "NVIDIA_CDI_HOOK_PATH" .Values.cdi.nvidiaHookPath "CDI_FEATURE_FLAGS" .Values.cdi.featureFlags "DEVICE_DISCOVERY_STRATEGY" .Values.deviceDiscoveryStrategy -}}
{{- $bools := dict "FAIL_ON_INIT_ERROR" .Values.failOnInitError "PASS_DEVICE_SPECS" .Values.compatWithCPUManager "GDRCOPY_ENABLED" .Values.gdrcopyEnabled "GDS_ENABLED" .Values.gdsEnabled "MOFED_ENABLED" .Values.mofedEnabled -}}
{{- range $name := keys $strings | sortAlpha }}
{{- $value := get $strings $name }}
{{- if typeIs "string" $value }}
- name: {{ $name }}
  value: {{ $value | quote }}
{{- end }}
{{- end }}
{{- range $name := keys $bools | sortAlpha }}
{{- $value := get $bools $name }}
{{- if typeIs "bool" $value }}
- name: {{ $name }}
  value: {{ $value | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{/* A read-only root filesystem needs a writable /tmp (MPS control commands and the simulator use it). */}}
{{- define "nvdp.tmpVolume" -}}
- name: tmp
  emptyDir:
    medium: Memory
    sizeLimit: 16Mi
{{- end -}}

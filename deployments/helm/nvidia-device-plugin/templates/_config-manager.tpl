{{/* ---- how a container gets its config, and the config-manager container that keeps its link ------------ */}}

{{/* How one main container gets its config: "" (no config), "config-manager" (reads the link config-manager
keeps), "in-process" (follows the label itself: `run` only; the MPS and GFD daemons then use config-manager) or
"node-name". .root: the chart; .component: device-plugin, mps-control-daemon or gpu-feature-discovery. */}}
{{- define "nvdp.configMode" -}}
{{- if include "nvdp.hasConfig" .root -}}
{{- $selection := .root.Values.config.selection -}}
{{- if and (eq $selection "in-process") (ne .component "device-plugin") -}}
config-manager
{{- else -}}
{{- $selection -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The config flags of a main container (args of run, mps-control-daemon, gpu-feature-discovery). */}}
{{- define "nvdp.configArgs" -}}
{{- $mode := include "nvdp.configMode" . }}
{{- $config := .root.Values.config }}
{{- if eq $mode "config-manager" }}
- --config-file=/config/config.yaml
{{- else if $mode }}
- --config-dir=/available-configs
{{- with $config.default }}
- --config-default={{ . }}
{{- end }}
- --config-fallback-strategies={{ join "," $config.fallbackStrategies }}
{{- if eq $mode "in-process" }}
- --node-config-label={{ $config.nodeLabel }}
{{- end }}
{{- end }}
{{- end -}}

{{/* Env that goes with nvdp.configArgs; NODE_NAME also where the main container calls the API itself (.api:
GFD's NodeFeature API, the DRA mode). */}}
{{- define "nvdp.configEnv" -}}
{{- $mode := include "nvdp.configMode" . }}
{{- if eq $mode "node-name" }}
# A key named after the node wins over the default: per-node configs without API access.
- name: NVDP_CONFIG_NAME
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
{{- end }}
{{- if or (eq $mode "in-process") .api }}
- name: NODE_NAME
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
{{- end }}
{{- end -}}

{{/* The config mounts of a main container, and the API token where it calls the API itself (.api). */}}
{{- define "nvdp.configMounts" -}}
{{- $mode := include "nvdp.configMode" . }}
{{- if $mode }}
- name: available-configs
  mountPath: /available-configs
  readOnly: true
{{- end }}
{{- if eq $mode "config-manager" }}
- name: config
  mountPath: /config
  readOnly: true
{{- end }}
{{- if or (eq $mode "in-process") .api }}
- name: kube-api-access
  mountPath: /var/run/secrets/kubernetes.io/serviceaccount
  readOnly: true
{{- end }}
{{- end -}}

{{/* The config volumes of one DaemonSet, and the API token's where its main container calls the API (.api). */}}
{{- define "nvdp.configVolumes" -}}
{{- $mode := include "nvdp.configMode" . }}
{{- if $mode }}
- name: available-configs
  configMap:
    name: {{ include "nvdp.configMapName" .root }}
{{- end }}
{{- if eq $mode "config-manager" }}
# The link config-manager points at the chosen key; the main container reads it.
- name: config
  emptyDir:
    medium: Memory
    sizeLimit: 1Mi
{{- end }}
{{- if or (and $mode (ne $mode "node-name")) .api }}
# What automountServiceAccountToken would mount, for the containers of this pod that call the API alone.
- name: kube-api-access
  projected:
    sources:
      - serviceAccountToken:
          path: token
          expirationSeconds: 3607
      - configMap:
          name: kube-root-ca.crt
          items:
            - key: ca.crt
              path: ca.crt
      - downwardAPI:
          items:
            - path: namespace
              fieldRef:
                fieldPath: metadata.namespace
{{- end }}
{{- end -}}

{{/* "true" when the release reads node labels through the API (and so needs its ClusterRole). */}}
{{- define "nvdp.readsNodeLabels" -}}
{{- if and (include "nvdp.hasConfig" .) (ne .Values.config.selection "node-name") -}}true{{- end -}}
{{- end -}}

{{/* One config-manager container. .root: the chart; .name: the container's name; .oneshot: init or sidecar. */}}
{{- define "nvdp.configManagerContainer" -}}
- name: {{ .name }}
  image: {{ include "nvdp.image" .root }}
  imagePullPolicy: {{ .root.Values.image.pullPolicy }}
  command: ["config-manager"]
  env:
    - name: ONESHOT
      value: {{ .oneshot | quote }}
    - name: NODE_NAME
      valueFrom:
        fieldRef:
          fieldPath: spec.nodeName
    - name: NODE_LABEL
      value: {{ .root.Values.config.nodeLabel | quote }}
    - name: CONFIG_FILE_SRCDIR
      value: /available-configs
    - name: CONFIG_FILE_DST
      value: /config/config.yaml
    - name: DEFAULT_CONFIG
      value: {{ .root.Values.config.default | quote }}
    # Both set here, as NVIDIA's chart sets them: config-manager's own defaults are its binary's (no fallback
    # strategies, SEND_SIGNAL true). The plugin reloads a re-pointed link by itself: no signal, no shared
    # process namespace.
    - name: FALLBACK_STRATEGIES
      value: {{ join "," .root.Values.config.fallbackStrategies | quote }}
    - name: SEND_SIGNAL
      value: "false"
  securityContext:
    {{- if .root.Values.configManager.securityContext }}
    {{- toYaml .root.Values.configManager.securityContext | nindent 4 }}
    {{- else }}
    runAsUser: 65534
    runAsGroup: 65534
    runAsNonRoot: true
    privileged: false
    allowPrivilegeEscalation: false
    readOnlyRootFilesystem: true
    capabilities:
      drop: ["ALL"]
    {{- end }}
  resources:
    {{- include "nvdp.resources" (dict "value" .root.Values.configManager.resources "cpu" "10m" "memory" "64Mi" "limit" "128Mi") | nindent 4 }}
  volumeMounts:
    - name: available-configs
      mountPath: /available-configs
      readOnly: true
    - name: config
      mountPath: /config
    - name: kube-api-access
      mountPath: /var/run/secrets/kubernetes.io/serviceaccount
      readOnly: true
{{- end -}}

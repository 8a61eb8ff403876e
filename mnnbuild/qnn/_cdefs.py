"""cffi (ABI mode) declarations for the subset of the QNN C API that mnnbuild uses.

Written for this project from the public QNN headers (API 2.13 .. 2.32) and checked against the
behaviour of the API 2.40 library shipped in ``onnxruntime-qnn``. Layout rules that matter:

* Every struct that the library reads or writes in arrays (``Qnn_Tensor_t``, graph infos) is
  declared in full, unions included, so that array strides match.
* Function tables are declared in full and in order; entries that mnnbuild never calls are
  typed ``void*`` (same size as a function pointer) so later offsets stay right. Newer
  libraries only append entries, so a shorter declaration is a valid prefix.
* ``va_list`` in the log callback is passed by pointer on x86_64 / aarch64 (SysV), so it is
  declared ``void*`` and handed to libc ``vsnprintf`` unchanged.
"""

from __future__ import annotations

# Scalar/handle types, versions, tensors, params, op configs (QnnCommon.h / QnnTypes.h).
TYPES_CDEF = """
typedef uint64_t Qnn_ErrorHandle_t;
typedef void* Qnn_Handle_t;
typedef Qnn_Handle_t Qnn_BackendHandle_t;
typedef Qnn_Handle_t Qnn_ContextHandle_t;
typedef Qnn_Handle_t Qnn_DeviceHandle_t;
typedef Qnn_Handle_t Qnn_GraphHandle_t;
typedef Qnn_Handle_t Qnn_LogHandle_t;
typedef Qnn_Handle_t Qnn_MemHandle_t;
typedef Qnn_Handle_t Qnn_ProfileHandle_t;
typedef Qnn_Handle_t Qnn_SignalHandle_t;
typedef uint64_t Qnn_ContextBinarySize_t;

typedef struct { uint32_t major; uint32_t minor; uint32_t patch; } Qnn_Version_t;
typedef struct { Qnn_Version_t coreApiVersion; Qnn_Version_t backendApiVersion; } Qnn_ApiVersion_t;

typedef struct {
  uint32_t dataType;
  union {
    float floatValue;
    double doubleValue;
    uint64_t uint64Value;
    int64_t int64Value;
    uint32_t uint32Value;
    int32_t int32Value;
    uint16_t uint16Value;
    int16_t int16Value;
    uint8_t uint8Value;
    int8_t int8Value;
    uint8_t bool8Value;
    const char* stringValue;
  };
} Qnn_Scalar_t;

typedef struct { float scale; int32_t offset; } Qnn_ScaleOffset_t;
typedef struct { uint32_t bitwidth; float scale; int32_t offset; } Qnn_BwScaleOffset_t;
typedef struct {
  int32_t axis; uint32_t numScaleOffsets; Qnn_ScaleOffset_t* scaleOffset;
} Qnn_AxisScaleOffset_t;
typedef struct {
  uint32_t bitwidth; int32_t axis; uint32_t numElements; float* scales; int32_t* offsets;
} Qnn_BwAxisScaleOffset_t;
typedef struct { uint32_t* blockSize; Qnn_ScaleOffset_t* scaleOffset; } Qnn_BlockEncoding_t;
typedef struct { float scale; float offset; } Qnn_FloatScaleOffset_t;
typedef struct { uint32_t* blockSize; Qnn_FloatScaleOffset_t* floatScaleOffset; } Qnn_FloatBlockEncoding_t;
typedef struct {
  uint32_t bitwidth; uint32_t* blockSize; Qnn_FloatScaleOffset_t* floatScaleOffset;
} Qnn_BwFloatBlockEncoding_t;

typedef struct {
  uint32_t encodingDefinition;
  uint32_t quantizationEncoding;
  union {
    Qnn_ScaleOffset_t scaleOffsetEncoding;
    Qnn_AxisScaleOffset_t axisScaleOffsetEncoding;
    Qnn_BwScaleOffset_t bwScaleOffsetEncoding;
    Qnn_BwAxisScaleOffset_t bwAxisScaleOffsetEncoding;
    Qnn_BlockEncoding_t blockEncoding;
    void* blockwiseExpansion;
    void* vectorEncoding;
    Qnn_FloatBlockEncoding_t floatBlockEncoding;
    void* bwAxisScaleOffsetMappedEncoding;
    void* bwBlockMappedEncoding;
    void* bwBlockwiseExpansionMappedEncoding;
    Qnn_BwFloatBlockEncoding_t bwFloatBlockEncoding;
  };
} Qnn_QuantizeParams_t;

typedef struct { void* data; uint32_t dataSize; } Qnn_ClientBuffer_t;

typedef struct {
  uint32_t id;
  const char* name;
  uint32_t type;
  uint32_t dataFormat;
  uint32_t dataType;
  Qnn_QuantizeParams_t quantizeParams;
  uint32_t rank;
  uint32_t* dimensions;
  uint32_t memType;
  union {
    Qnn_ClientBuffer_t clientBuf;
    Qnn_MemHandle_t memHandle;
  };
} Qnn_TensorV1_t;

typedef struct { uint32_t numSpecifiedElements; uint32_t numSparseDimensions; } Qnn_SparseLayoutHybridCoo_t;
typedef struct {
  uint32_t type;
  union { Qnn_SparseLayoutHybridCoo_t hybridCoo; };
} Qnn_SparseParams_t;

typedef struct {
  uint32_t id;
  const char* name;
  uint32_t type;
  uint32_t dataFormat;
  uint32_t dataType;
  Qnn_QuantizeParams_t quantizeParams;
  uint32_t rank;
  uint32_t* dimensions;
  uint32_t memType;
  union {
    Qnn_ClientBuffer_t clientBuf;
    Qnn_MemHandle_t memHandle;
    void* retrieveRaw;
  };
  uint8_t* isDynamicDimensions;
  Qnn_SparseParams_t sparseParams;
  uint8_t isProduced;
} Qnn_TensorV2_t;

typedef struct {
  uint32_t version;
  union {
    Qnn_TensorV1_t v1;
    Qnn_TensorV2_t v2;
  };
} Qnn_Tensor_t;

typedef struct {
  uint32_t paramType;
  const char* name;
  union {
    Qnn_Scalar_t scalarParam;
    Qnn_Tensor_t tensorParam;
  };
} Qnn_Param_t;

typedef struct {
  const char* name;
  const char* packageName;
  const char* typeName;
  uint32_t numOfParams;
  Qnn_Param_t* params;
  uint32_t numOfInputs;
  Qnn_Tensor_t* inputTensors;
  uint32_t numOfOutputs;
  Qnn_Tensor_t* outputTensors;
} Qnn_OpConfigV1_t;

typedef struct {
  uint32_t version;
  union { Qnn_OpConfigV1_t v1; };
} Qnn_OpConfig_t;

/* Same layout as Qnn_OpConfig_t (its union has a single member). cffi's ABI mode cannot pass a
   struct with an anonymous union by value, so the by-value entry points take this one. */
typedef struct {
  uint32_t version;
  Qnn_OpConfigV1_t v1;
} Qnn_OpConfigArg_t;
"""

# Backend / device / context / graph configs, including the HTP custom configs.
CONFIGS_CDEF = """
typedef struct { uint32_t reportingLevel; uint32_t storageLimit; } Qnn_ErrorReportingConfig_t;

typedef struct {
  uint32_t option;
  union { void* customConfig; Qnn_ErrorReportingConfig_t errorConfig; const char** platformOptions; };
} QnnBackend_Config_t;

typedef struct {
  uint32_t option;
  union { void* customConfig; void* hardwareInfo; };
} QnnDevice_Config_t;

typedef struct {
  uint32_t option;
  union {
    void* customConfig;
    uint32_t priority;
    Qnn_ErrorReportingConfig_t errorConfig;
    const char* oemString;
    uint64_t asyncExeQueueDepth;
    const char* const* enableGraphs;
    uint64_t memoryLimitHint;
    uint8_t isPersistentBinary;
    uint32_t binaryCompatibilityType;
    uint8_t isGraphInitDeferred;
  };
} QnnContext_Config_t;

typedef struct {
  uint32_t option;
  union {
    void* customConfig;
    uint32_t priority;
    Qnn_ProfileHandle_t profileHandle;
    uint32_t profilingState;
    uint32_t numProfilingExecutions;
    uint8_t enableBinarySectionWeightsUpdates;
  };
} QnnGraph_Config_t;

typedef struct {
  uint32_t option;
  union { void* customConfig; uint64_t timeoutDurationUs; };
} QnnSignal_Config_t;

/* HTP device custom config. The API 2.40 library reads the union at offset 8 (the 2.32
   headers put it at 4); the uint64_t member forces that alignment. */
typedef struct { uint32_t deviceId; uint32_t arch; } QnnHtpDevice_MinimumArch_t;
typedef struct {
  uint32_t option;
  union {
    uint32_t socModel;
    QnnHtpDevice_MinimumArch_t arch;
    uint64_t _align8;
  };
} QnnHtpDevice_CustomConfig_t;

typedef struct { uint32_t type; float floatValue; } QnnHtpGraph_OptimizationOption_t;
typedef struct { const char* key; Qnn_Scalar_t value; } QnnHtpGraph_FinalizeConfig_t;
typedef struct {
  uint32_t option;
  union {
    QnnHtpGraph_OptimizationOption_t optimizationOption;
    uint32_t precision;
    uint32_t vtcmSizeInMB;
    uint64_t numHvxThreads;
    void* reserved;
    QnnHtpGraph_FinalizeConfig_t finalizeConfig;
    uint32_t numCores;
    uint8_t _union_bytes[48];
  };
} QnnHtpGraph_CustomConfig_t;

typedef struct { Qnn_ContextHandle_t firstGroupHandle; uint64_t maxSpillFillBuffer; } QnnHtpContext_GroupRegistration_t;
typedef struct {
  uint32_t option;
  union {
    bool weightSharingEnabled;
    QnnHtpContext_GroupRegistration_t groupRegistration;
    uint64_t fileReadMemoryBudgetInMb;
    bool shareResources;
    bool isPrepareOnly;
    bool initAcceleration;
    bool skipValidationOnBinarySection;
    uint32_t shareResOptType;
  };
} QnnHtpContext_CustomConfig_t;

typedef void (*QnnContext_NotifyFn_t)(Qnn_ContextHandle_t context, Qnn_GraphHandle_t graph,
                                      const char* graphName, uint32_t notifyType, void* notifyParam,
                                      Qnn_ErrorHandle_t status);
typedef struct {
  const QnnContext_Config_t** config;
  const void* binaryBuffer;
  Qnn_ContextBinarySize_t binaryBufferSize;
  Qnn_ProfileHandle_t profile;
  QnnContext_NotifyFn_t notifyFunc;
  void* notifyParam;
} QnnContext_ParamsV1_t;
typedef struct {
  uint32_t version;
  union { QnnContext_ParamsV1_t v1; void* v2; };
} QnnContext_Params_t;

/* contextCreateFromBinaryWithCallback: the application supplies (parts of) the binary on request.
   The unions of the header's callback structs are flattened to their raw-buffer member (same
   layout), since cffi callbacks cannot take structs with anonymous unions. */
typedef struct { uint64_t offset; uint64_t size; uint8_t isBackendMappingNeeded; } Qnn_ContextBinaryDataRequest_t;
typedef struct { void* memPtr; uint64_t dataStartOffset; uint64_t alignedSize; } Qnn_ContextBinaryRawDataResponse_t;
typedef struct { void* memPtr; uint64_t memSize; } Qnn_ContextBinaryRawDataMem_t;
typedef Qnn_ErrorHandle_t (*Qnn_ContextBinaryRawDataProviderFn_t)(Qnn_ContextBinaryDataRequest_t,
                                                                  Qnn_ContextBinaryRawDataResponse_t*, void*);
typedef Qnn_ErrorHandle_t (*Qnn_ContextBinaryRawDataReleaseFn_t)(Qnn_ContextBinaryRawDataMem_t, void*);
typedef struct {
  Qnn_ContextBinaryRawDataProviderFn_t dataProvide;
  Qnn_ContextBinaryRawDataReleaseFn_t dataRelease;
  void* notifyParam;
} Qnn_ContextBinaryRawBufferCallbackV1_t;
typedef struct { uint32_t version; Qnn_ContextBinaryRawBufferCallbackV1_t v1; } Qnn_ContextBinaryRawBufferCallback_t;
typedef struct { uint32_t type; Qnn_ContextBinaryRawBufferCallback_t rawBufferCallback; } Qnn_ContextBinaryCallback_t;
"""

# The backend interface (QnnInterface.h): provider struct and its function table.
INTERFACE_CDEF = """
typedef void (*QnnLog_Callback_t)(const char* fmt, uint32_t level, uint64_t timestamp, void* args);

typedef struct {
  void* propertyHasCapability;
  Qnn_ErrorHandle_t (*backendCreate)(Qnn_LogHandle_t, const QnnBackend_Config_t**, Qnn_BackendHandle_t*);
  void* backendSetConfig;
  Qnn_ErrorHandle_t (*backendGetApiVersion)(Qnn_ApiVersion_t*);
  Qnn_ErrorHandle_t (*backendGetBuildId)(const char**);
  void* backendRegisterOpPackage;
  void* backendGetSupportedOperations;
  Qnn_ErrorHandle_t (*backendValidateOpConfig)(Qnn_BackendHandle_t, Qnn_OpConfigArg_t);
  Qnn_ErrorHandle_t (*backendFree)(Qnn_BackendHandle_t);
  Qnn_ErrorHandle_t (*contextCreate)(Qnn_BackendHandle_t, Qnn_DeviceHandle_t, const QnnContext_Config_t**,
                                     Qnn_ContextHandle_t*);
  void* contextSetConfig;
  Qnn_ErrorHandle_t (*contextGetBinarySize)(Qnn_ContextHandle_t, Qnn_ContextBinarySize_t*);
  Qnn_ErrorHandle_t (*contextGetBinary)(Qnn_ContextHandle_t, void*, Qnn_ContextBinarySize_t,
                                        Qnn_ContextBinarySize_t*);
  Qnn_ErrorHandle_t (*contextCreateFromBinary)(Qnn_BackendHandle_t, Qnn_DeviceHandle_t,
                                               const QnnContext_Config_t**, const void*,
                                               Qnn_ContextBinarySize_t, Qnn_ContextHandle_t*,
                                               Qnn_ProfileHandle_t);
  Qnn_ErrorHandle_t (*contextFree)(Qnn_ContextHandle_t, Qnn_ProfileHandle_t);
  Qnn_ErrorHandle_t (*graphCreate)(Qnn_ContextHandle_t, const char*, const QnnGraph_Config_t**,
                                   Qnn_GraphHandle_t*);
  void* graphCreateSubgraph;
  void* graphSetConfig;
  Qnn_ErrorHandle_t (*graphAddNode)(Qnn_GraphHandle_t, Qnn_OpConfigArg_t);
  Qnn_ErrorHandle_t (*graphFinalize)(Qnn_GraphHandle_t, Qnn_ProfileHandle_t, Qnn_SignalHandle_t);
  Qnn_ErrorHandle_t (*graphRetrieve)(Qnn_ContextHandle_t, const char*, Qnn_GraphHandle_t*);
  Qnn_ErrorHandle_t (*graphExecute)(Qnn_GraphHandle_t, const Qnn_Tensor_t*, uint32_t, Qnn_Tensor_t*,
                                    uint32_t, Qnn_ProfileHandle_t, Qnn_SignalHandle_t);
  void* graphExecuteAsync;
  Qnn_ErrorHandle_t (*tensorCreateContextTensor)(Qnn_ContextHandle_t, Qnn_Tensor_t*);
  Qnn_ErrorHandle_t (*tensorCreateGraphTensor)(Qnn_GraphHandle_t, Qnn_Tensor_t*);
  Qnn_ErrorHandle_t (*logCreate)(QnnLog_Callback_t, uint32_t, Qnn_LogHandle_t*);
  Qnn_ErrorHandle_t (*logSetLogLevel)(Qnn_LogHandle_t, uint32_t);
  Qnn_ErrorHandle_t (*logFree)(Qnn_LogHandle_t);
  void* profileCreate;
  void* profileSetConfig;
  void* profileGetEvents;
  void* profileGetSubEvents;
  void* profileGetEventData;
  void* profileGetExtendedEventData;
  void* profileFree;
  void* memRegister;
  void* memDeRegister;
  void* deviceGetPlatformInfo;
  void* deviceFreePlatformInfo;
  void* deviceGetInfrastructure;
  Qnn_ErrorHandle_t (*deviceCreate)(Qnn_LogHandle_t, const QnnDevice_Config_t**, Qnn_DeviceHandle_t*);
  void* deviceSetConfig;
  void* deviceGetInfo;
  Qnn_ErrorHandle_t (*deviceFree)(Qnn_DeviceHandle_t);
  Qnn_ErrorHandle_t (*signalCreate)(Qnn_BackendHandle_t, const QnnSignal_Config_t**, Qnn_SignalHandle_t*);
  void* signalSetConfig;
  void* signalTrigger;
  Qnn_ErrorHandle_t (*signalFree)(Qnn_SignalHandle_t);
  Qnn_ErrorHandle_t (*errorGetMessage)(Qnn_ErrorHandle_t, const char**);
  Qnn_ErrorHandle_t (*errorGetVerboseMessage)(Qnn_ErrorHandle_t, const char**);
  Qnn_ErrorHandle_t (*errorFreeVerboseMessage)(const char*);
  void* graphPrepareExecutionEnvironment;
  void* graphReleaseExecutionEnvironment;
  void* graphGetProperty;
  Qnn_ErrorHandle_t (*contextValidateBinary)(Qnn_BackendHandle_t, Qnn_DeviceHandle_t,
                                             const QnnContext_Config_t**, const void*,
                                             Qnn_ContextBinarySize_t);
  Qnn_ErrorHandle_t (*contextCreateFromBinaryWithSignal)(Qnn_BackendHandle_t, Qnn_DeviceHandle_t,
                                                         const QnnContext_Config_t**, const void*,
                                                         Qnn_ContextBinarySize_t, Qnn_ContextHandle_t*,
                                                         Qnn_ProfileHandle_t, Qnn_SignalHandle_t);
  Qnn_ErrorHandle_t (*contextCreateFromBinaryListAsync)(Qnn_BackendHandle_t, Qnn_DeviceHandle_t,
                                                        const QnnContext_Params_t**,
                                                        const QnnContext_Config_t**, Qnn_SignalHandle_t);
  void* tensorUpdateGraphTensors;
  void* tensorUpdateContextTensors;
  void* contextGetBinarySectionSize;
  void* contextGetBinarySection;
  void* contextApplyBinarySection;
  void* backendGetProperty;
  void* contextGetProperty;
  void* contextGetIncrementalBinary;
  void* contextReleaseIncrementalBinary;
  Qnn_ErrorHandle_t (*contextFinalize)(Qnn_ContextHandle_t, Qnn_ProfileHandle_t);
  void* globalConfigSet;
  Qnn_ErrorHandle_t (*contextCreateFromBinaryWithCallback)(Qnn_BackendHandle_t, Qnn_DeviceHandle_t,
                                                           const QnnContext_Config_t**,
                                                           const Qnn_ContextBinaryCallback_t*, const void*,
                                                           Qnn_ContextBinarySize_t, Qnn_ContextHandle_t*,
                                                           Qnn_ProfileHandle_t, Qnn_SignalHandle_t);
  void* contextGetBinarySectionUpdate;
  void* contextFreeBinarySectionUpdate;
} QnnInterface_Table_t;

typedef struct {
  uint32_t backendId;
  const char* providerName;
  Qnn_ApiVersion_t apiVersion;
  union { QnnInterface_Table_t table; };
} QnnInterface_t;

Qnn_ErrorHandle_t QnnInterface_getProviders(const QnnInterface_t*** providerList, uint32_t* numProviders);
"""

# The system interface (QnnSystemInterface.h / QnnSystemContext.h): context binary info.
SYSTEM_CDEF = """
typedef void* QnnSystemContext_Handle_t;

typedef struct {
  const char* graphName;
  uint32_t numGraphInputs;
  Qnn_Tensor_t* graphInputs;
  uint32_t numGraphOutputs;
  Qnn_Tensor_t* graphOutputs;
} QnnSystemContext_GraphInfoV1_t;
typedef struct {
  const char* graphName;
  uint32_t numGraphInputs;
  Qnn_Tensor_t* graphInputs;
  uint32_t numGraphOutputs;
  Qnn_Tensor_t* graphOutputs;
  uint32_t numUpdateableTensors;
  Qnn_Tensor_t* updateableTensors;
} QnnSystemContext_GraphInfoV2_t;
typedef struct {
  const char* graphName;
  uint32_t numGraphInputs;
  Qnn_Tensor_t* graphInputs;
  uint32_t numGraphOutputs;
  Qnn_Tensor_t* graphOutputs;
  uint32_t numUpdateableTensors;
  Qnn_Tensor_t* updateableTensors;
  uint32_t graphBlobInfoSize;
  void* graphBlobInfo;
  uint32_t startOpIndex;
  uint32_t endOpIndex;
} QnnSystemContext_GraphInfoV3_t;
typedef struct {
  uint32_t version;
  union {
    QnnSystemContext_GraphInfoV1_t graphInfoV1;
    QnnSystemContext_GraphInfoV2_t graphInfoV2;
    QnnSystemContext_GraphInfoV3_t graphInfoV3;
  };
} QnnSystemContext_GraphInfo_t;

typedef struct {
  uint32_t backendId;
  const char* buildId;
  Qnn_Version_t coreApiVersion;
  Qnn_Version_t backendApiVersion;
  const char* socVersion;
  Qnn_Version_t hwInfoBlobVersion;
  Qnn_Version_t contextBlobVersion;
  uint32_t hwInfoBlobSize;
  void* hwInfoBlob;
  uint64_t contextBlobSize;
  uint32_t numContextTensors;
  Qnn_Tensor_t* contextTensors;
  uint32_t numGraphs;
  QnnSystemContext_GraphInfo_t* graphs;
} QnnSystemContext_BinaryInfoV1_t;
typedef struct {
  uint32_t backendId;
  const char* buildId;
  Qnn_Version_t coreApiVersion;
  Qnn_Version_t backendApiVersion;
  const char* socVersion;
  Qnn_Version_t hwInfoBlobVersion;
  Qnn_Version_t contextBlobVersion;
  uint32_t hwInfoBlobSize;
  void* hwInfoBlob;
  uint64_t contextBlobSize;
  uint32_t numContextTensors;
  Qnn_Tensor_t* contextTensors;
  uint32_t numGraphs;
  QnnSystemContext_GraphInfo_t* graphs;
  void* platformInfo;
} QnnSystemContext_BinaryInfoV2_t;
typedef struct {
  uint32_t backendId;
  const char* buildId;
  Qnn_Version_t coreApiVersion;
  Qnn_Version_t backendApiVersion;
  const char* socVersion;
  Qnn_Version_t contextBlobVersion;
  uint64_t contextBlobSize;
  uint32_t numContextTensors;
  Qnn_Tensor_t* contextTensors;
  uint32_t numGraphs;
  QnnSystemContext_GraphInfo_t* graphs;
  void* platformInfo;
  uint32_t contextMetadataSize;
  void* contextMetadata;
  uint32_t socModel;
} QnnSystemContext_BinaryInfoV3_t;
typedef struct {
  uint32_t version;
  union {
    QnnSystemContext_BinaryInfoV1_t contextBinaryInfoV1;
    QnnSystemContext_BinaryInfoV2_t contextBinaryInfoV2;
    QnnSystemContext_BinaryInfoV3_t contextBinaryInfoV3;
  };
} QnnSystemContext_BinaryInfo_t;

typedef struct {
  Qnn_ErrorHandle_t (*systemContextCreate)(QnnSystemContext_Handle_t*);
  Qnn_ErrorHandle_t (*systemContextGetBinaryInfo)(QnnSystemContext_Handle_t, void*, uint64_t,
                                                  const QnnSystemContext_BinaryInfo_t**,
                                                  Qnn_ContextBinarySize_t*);
  void* systemContextGetMetaData;
  Qnn_ErrorHandle_t (*systemContextFree)(QnnSystemContext_Handle_t);
  void* systemTensorGetMemoryFootprint;
  void* systemLogCreate;
  void* systemLogSetLogLevel;
  void* systemLogFree;
} QnnSystemInterface_Table_t;

typedef struct {
  uint32_t backendId;
  const char* providerName;
  Qnn_Version_t systemApiVersion;
  union { QnnSystemInterface_Table_t table; };
} QnnSystemInterface_t;

Qnn_ErrorHandle_t QnnSystemInterface_getProviders(const QnnSystemInterface_t*** providerList,
                                                  uint32_t* numProviders);
"""

# libc, for formatting the log callback's (fmt, va_list).
LIBC_CDEF = """
int vsnprintf(char* str, size_t size, const char* format, void* ap);
"""

CDEF = TYPES_CDEF + CONFIGS_CDEF + INTERFACE_CDEF + SYSTEM_CDEF + LIBC_CDEF

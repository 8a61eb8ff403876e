// mnnbuild conformance driver: greedy generation through MNN's own Llm engine, per-step logits dumped.
//
// Usage: conform_driver <config.json> <prompt_ids> <max_new_tokens> <chunk> <logits.f32>
//   prompt_ids      comma-separated token ids
//   chunk           the config's prefill chunk (0: none); locates the last real row of a padded chunk
//   logits.f32      written: one float32 row (the vocabulary) per generated token
// Prints one JSON object on stdout: the stepped tokens, the tokens of Llm::generate (the engine's own
// decode loop) for the same prompt, and times. Exit code 0 on success, 1 on any failure (message on stderr).
//
// The stepped loop is the engine's decode path: Llm::forward runs the prompt through the chunked prefill
// (padding the last chunk per `chunk_limits`) and each new token as one decode step against the KV cache.
// Only the sampler is ours (argmax), so every step's logits can be dumped; Llm::generate then runs the
// engine's own loop with `sampler_type = greedy` and must give the same tokens. With `speculative_type = eagle`
// that loop is MNN's EagleGeneration, which appends its count of target forwards to the tokens it returns;
// "generated" is that list as returned (run.py splits the count off).
#include <MNN/expr/Expr.hpp>
#include <MNN/expr/ExecutorScope.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "llm/llm.hpp"

using MNN::Express::VARP;
using MNN::Transformer::Llm;

namespace {

std::vector<int> parseIds(const std::string& text) {
    std::vector<int> ids;
    std::stringstream ss(text);
    std::string item;
    while (std::getline(ss, item, ',')) {
        if (!item.empty()) {
            ids.push_back(std::stoi(item));
        }
    }
    return ids;
}

double secondsSince(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The logits row of the last real token. A padded prefill returns every row of the padded chunk; an
// unpadded one (or a decode step) returns only the last row.
const float* lastRow(VARP logits, int realTokens, int chunk, int* vocab) {
    auto info = logits->getInfo();
    if (info == nullptr || info->dim.empty()) {
        return nullptr;
    }
    *vocab = info->dim.back();
    int rows = static_cast<int>(info->size / *vocab);
    int row = 0;
    if (rows > 1) {
        int remain = chunk > 0 ? realTokens % chunk : realTokens;
        row = (remain == 0 ? rows : remain) - 1;
    }
    const float* base = logits->readMap<float>();
    return base == nullptr ? nullptr : base + static_cast<size_t>(row) * *vocab;
}

// JSON string body; a token may end inside a UTF-8 character, so bytes >= 0x80 pass through and the
// reader decodes the line with replacement.
std::string jsonText(Llm* llm, const std::vector<int>& ids) {
    std::string out;
    for (int id : ids) {
        for (unsigned char c : llm->tokenizer_decode(id)) {
            if (c == '"' || c == '\\') {
                out += '\\';
                out += static_cast<char>(c);
            } else if (c < 0x20) {
                char buf[8];
                std::snprintf(buf, sizeof(buf), "\\u%04x", c);
                out += buf;
            } else {
                out += static_cast<char>(c);
            }
        }
    }
    return out;
}

std::string joinIds(const std::vector<int>& ids) {
    std::string out;
    for (size_t i = 0; i < ids.size(); ++i) {
        out += (i ? "," : "") + std::to_string(ids[i]);
    }
    return out;
}

}  // namespace

int main(int argc, const char* argv[]) {
    if (argc != 6) {
        std::cerr << "usage: " << argv[0] << " config.json prompt_ids max_new_tokens chunk logits.f32" << std::endl;
        return 1;
    }
    const std::string configPath = argv[1];
    const std::vector<int> prompt = parseIds(argv[2]);
    const int maxNew = std::atoi(argv[3]);
    const int chunk = std::atoi(argv[4]);
    const std::string logitsPath = argv[5];
    if (prompt.empty() || maxNew <= 0) {
        std::cerr << "conform_driver: empty prompt or max_new_tokens <= 0" << std::endl;
        return 1;
    }

    auto t0 = std::chrono::steady_clock::now();
    std::unique_ptr<Llm, void (*)(Llm*)> llm(Llm::createLLM(configPath), Llm::destroy);
    if (!llm) {
        std::cerr << "conform_driver: Llm::createLLM failed for " << configPath << std::endl;
        return 1;
    }
    llm->set_config("{\"sampler_type\": \"greedy\", \"async\": false}");
    if (!llm->load()) {
        std::cerr << "conform_driver: Llm::load failed for " << configPath << std::endl;
        return 1;
    }
    const double loadSeconds = secondsSince(t0);

    // 1. stepped greedy loop with logits
    std::ofstream logitsFile(logitsPath, std::ios::binary);
    std::vector<int> stepped;
    llm->generate_init(nullptr, nullptr);
    t0 = std::chrono::steady_clock::now();
    VARP logits = llm->forward(prompt);
    const double prefillSeconds = secondsSince(t0);
    int realTokens = static_cast<int>(prompt.size());
    t0 = std::chrono::steady_clock::now();
    for (int step = 0; step < maxNew; ++step) {
        if (logits == nullptr) {
            std::cerr << "conform_driver: forward returned no logits at step " << step << std::endl;
            return 1;
        }
        int vocab = 0;
        const float* row = lastRow(logits, realTokens, chunk, &vocab);
        if (row == nullptr) {
            std::cerr << "conform_driver: unreadable logits at step " << step << std::endl;
            return 1;
        }
        logitsFile.write(reinterpret_cast<const char*>(row), static_cast<std::streamsize>(vocab) * sizeof(float));
        int best = 0;
        for (int i = 1; i < vocab; ++i) {
            if (row[i] > row[best]) {
                best = i;
            }
        }
        stepped.push_back(best);
        if (step + 1 < maxNew) {
            logits = llm->forward(std::vector<int>{best});
            realTokens = 1;
        }
    }
    const double decodeSeconds = secondsSince(t0);
    logitsFile.close();

    // 2. the engine's own generation loop, same prompt, fresh KV cache
    llm->generate_init(nullptr, nullptr);
    t0 = std::chrono::steady_clock::now();
    std::vector<int> generated = llm->generate(prompt, maxNew);
    const double generateSeconds = secondsSince(t0);

    std::cout << "{\"stepped\": [" << joinIds(stepped) << "], \"generated\": [" << joinIds(generated)
              << "], \"text\": \"" << jsonText(llm.get(), stepped) << "\", \"load_s\": " << loadSeconds << ", \"prefill_s\": " << prefillSeconds
              << ", \"decode_s\": " << decodeSeconds << ", \"generate_s\": " << generateSeconds << "}" << std::endl;
    return logitsFile.fail() ? 1 : 0;
}

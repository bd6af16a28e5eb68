"""Templated generator of labelled decision questions: the distillation mix.

Every question's gold answer is correct by construction: a state is assembled from
sentences chosen for known latent attributes (category, level, boolean fact). Held-out
domains and held-out question templates exist so the distilled student is measured on
domains and wordings it was never trained on. Standard library only.
"""

import argparse
import json
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Item:
    """One generated record plus where it came from."""

    record: dict
    domain: str
    layout: str
    templates: tuple[str, ...]


def _d(name, noun, attr, ask, pred, neg, cats, score, fact, fillers, jsn, family, pool=True):
    return {"name": name, "noun": noun, "attr": attr, "ask": ask, "pred": pred, "neg": neg,
            "cats": cats, "score": score, "fact": fact, "fillers": fillers, "json": jsn,
            "family": family, "pool": pool}


_ABOUT, _NOT_ABOUT = "is about {desc}", "is not about {desc}"

_DOMAINS = [
    _d("support", "message", "team", "Which team should handle this message?", _ABOUT, _NOT_ABOUT, [
        ("billing", "payments, charges, invoices and refunds", [
            "I was charged twice for order {order}.",
            "My invoice from {date} shows {amount} more than I agreed to pay.",
            "Could you refund the {amount} you took from my card by mistake?",
            "The payment for my subscription went through two times this month."]),
        ("shipping", "deliveries, lost or damaged packages", [
            "My package never arrived even though the site says it was delivered.",
            "The box for order {order} showed up crushed and the contents are broken.",
            "The courier left my parcel at the wrong address in {city}.",
            "Tracking for order {order} has not moved since {date}."]),
        ("technical", "software bugs, crashes and login errors", [
            "The app crashes every time I open the settings page.",
            "I cannot log in, it keeps saying my password is wrong even after a reset.",
            "The website shows error 500 when I click checkout.",
            "Since the last update the sync feature freezes my phone."]),
        ("account", "profile changes, email updates and closing accounts", [
            "Please change the email address on my account to a new one.",
            "I want to close my account and delete my profile.",
            "How do I change the name shown on my profile to {name}?",
            "I need to transfer ownership of my account to my colleague {name2}."]),
        ("sales", "pricing questions, quotes and buying more licenses", [
            "We want a quote for {num} more licenses for our team.",
            "Do you offer a discount if we buy the enterprise plan for a year?",
            "I'd like to talk to someone about upgrading our company to the business tier.",
            "What would pricing look like for {num} extra seats?"]),
        ("feedback", "feature requests and product suggestions", [
            "It would be great if the app had a dark mode.",
            "Please consider adding an option to export my data to a spreadsheet.",
            "My suggestion is to let users reorder items in their lists.",
            "I'd love to see a calendar view in the next version."]),
    ], ("urgency", ["Low", "Medium", "High", "Critical"], [
        ["No rush on this, whenever you have time is fine.", "This is not urgent at all."],
        ["I'd appreciate an answer within the next few days.",
         "Please look at this sometime this week."],
        ["I need this sorted today, please.",
         "This is urgent, it needs to be fixed as soon as possible."],
        ["Our whole business is down right now and we are losing money every minute!",
         "Everything has stopped for all of our users, this is an emergency!"]]),
       ("mentions that the customer has written about this before",
        "does not mention that the customer has written about this before",
        ["This is the third time I am writing about this.",
         "I already contacted you about this last week and got no reply."],
        ["This is my first time contacting you about it.",
         "I have not reached out about this before."]),
       ["I have been a customer for a few years.", "I usually use the mobile app.",
        "My account is registered under my work email.", "I hope you are having a good day.",
        "Thanks in advance for reading this.", "I am writing from my laptop at home."],
       ("ticket_id", "customer", {"channel": ["email", "chat", "phone", "web form"]}, "message"),
       "service"),
    _d("reviews", "review", "product type", "What kind of product is this review about?",
       _ABOUT, _NOT_ABOUT, [
        ("electronics", "phones, headphones, laptops and other gadgets", [
            "I bought these wireless headphones for my commute.",
            "This laptop is what I now use for work every day.",
            "I got this phone charger as a spare for the office.",
            "The smartwatch arrived on {date} and I paired it with my phone."]),
        ("kitchen", "cookware, blenders and kitchen tools", [
            "I use this blender every morning for smoothies.",
            "This frying pan replaced my old one in the kitchen.",
            "The knife set came in a wooden block for the counter.",
            "I bought this coffee grinder to grind beans at home."]),
        ("clothing", "shirts, shoes, jackets and other apparel", [
            "I ordered this rain jacket in size medium.",
            "These running shoes are the ones I wear on my morning jogs.",
            "I bought the wool sweater for the winter.",
            "The jeans came in dark blue as pictured."]),
        ("books", "novels, textbooks and other books", [
            "I read this novel over the weekend.",
            "This cookbook has about two hundred recipes in it.",
            "I bought the textbook for my statistics class.",
            "The paperback edition of this thriller arrived on {date}."]),
        ("toys", "toys and games for children", [
            "I bought this building block set for my nephew.",
            "My daughter got this doll for her birthday.",
            "The remote control car was a gift for my son.",
            "This board game is meant for kids aged six and up."]),
        ("beauty", "skincare, makeup and hair care", [
            "I have been using this face moisturizer every night.",
            "This shampoo is what I now use for my curly hair.",
            "I bought the lipstick in the shade called ruby.",
            "The sunscreen goes on before my makeup each morning."]),
        ("garden", "plants, seeds and gardening tools", [
            "I used this hose to water my vegetable patch.",
            "These tomato seeds went into my garden beds in spring.",
            "I bought the pruning shears for my rose bushes.",
            "This lawn mower is what I use on my back yard."]),
    ], ("sentiment", ["Very negative", "Negative", "Neutral", "Positive", "Very positive"], [
        ["It is absolutely terrible and I regret every cent I spent.",
         "Worst purchase I have ever made, complete garbage."],
        ["I'm disappointed, it is worse than I expected.",
         "Not great, I would probably not buy it again."],
        ["It is okay, nothing special either way.", "It does the job, neither good nor bad."],
        ["I'm happy with it, it works well.", "Good quality, I would recommend it."],
        ["Absolutely amazing, I love it and would give it ten stars if I could!",
         "Best purchase of the year, it is perfect in every way!"]]),
       ("mentions that the item arrived late", "does not mention that the item arrived late",
        ["It arrived two weeks later than promised.", "Delivery was very late."],
        ["It arrived right on time.", "Delivery was on the promised day."]),
       ["I ordered it online.", "The packaging was a plain cardboard box.",
        "I have had it for about a month now.", "My partner also tried it.",
        "I compared a few options before choosing.", "The listing had plenty of photos."],
       ("review_id", "reviewer", {"store": ["web", "app", "marketplace"]}, "text"),
       "commerce"),
    _d("moderation", "post", "moderation label", "How should this post be labelled?",
       "fits the label {label} ({desc})", "does not fit the label {label} ({desc})", [
        ("harassment", "insults or attacks directed at a person", [
            "{name}, you are a worthless idiot and everyone here hates you.",
            "Nobody wants you here {name}, go crawl back under your rock, loser.",
            "Hey {name}, you are the dumbest person I have ever seen online.",
            "{name} is a pathetic clown and should be ashamed to exist."]),
        ("spam", "repetitive unsolicited bulk advertising or scams", [
            "CLICK HERE to WIN a FREE iPhone!!! Limited offer!!!",
            "Cheap pills, no prescription, best price, visit now now now!!!",
            "Earn {amount} a day from home, send me a message to learn the secret!!!",
            "Buy followers buy likes buy views cheap cheap cheap!!!"]),
        ("self_promotion", "the author advertising their own channel, shop or work", [
            "Check out my new YouTube channel where I post cooking videos every week!",
            "I just opened my own candle shop, use my code to get ten percent off.",
            "Please follow my art page, I post new drawings there daily.",
            "My new book is out now, grab your copy at my website."]),
        ("misinformation", "false claims presented as fact", [
            "Drinking bleach cures the flu, doctors just don't want you to know.",
            "The moon landing was filmed in a studio, it never happened.",
            "Vaccines contain microchips that track your location.",
            "5G towers are what really cause the common cold."]),
        ("violent_threat", "threats to physically hurt someone", [
            "I know where you live {name} and I am going to hurt you.",
            "If I see you in {city} again I will beat you up.",
            "Say that again and I will come to your house and break your legs.",
            "Watch your back tonight {name}, I am coming for you."]),
        ("safe", "ordinary, harmless content", [
            "Does anyone have a good recipe for banana bread?",
            "The sunset in {city} was beautiful tonight.",
            "Congrats to {name} on finishing the marathon!",
            "I finally finished the puzzle I started last month."]),
    ], None, None,
       ["This post was shared in a public group.", "It got a handful of replies.",
        "The account was created some time ago.", "The post has a photo attached.",
        "Several users viewed the thread.", "The group is about local news."],
       ("post_id", "author", {"platform": ["forum", "comments", "social feed"]}, "text"),
       "messages", False),
    _d("language", "text", "language", "Which language is this text written in?",
       "is written in {desc}", "is not written in {desc}", [
        ("english", "English", [
            "The train to {city} leaves at nine in the morning.",
            "My sister {name} bought a new bicycle last week.",
            "We are going to the beach if the weather is nice.",
            "Could you please close the window, it is cold in here."]),
        ("french", "French", [
            "Le train pour {city} part à neuf heures du matin.",
            "Ma sœur {name} a acheté un nouveau vélo la semaine dernière.",
            "Nous irons à la plage s'il fait beau.",
            "Pourriez-vous fermer la fenêtre, il fait froid ici."]),
        ("spanish", "Spanish", [
            "El tren a {city} sale a las nueve de la mañana.",
            "Mi hermana {name} compró una bicicleta nueva la semana pasada.",
            "Vamos a ir a la playa si hace buen tiempo.",
            "¿Podrías cerrar la ventana, por favor? Hace frío aquí."]),
        ("german", "German", [
            "Der Zug nach {city} fährt um neun Uhr morgens ab.",
            "Meine Schwester {name} hat letzte Woche ein neues Fahrrad gekauft.",
            "Wir gehen an den Strand, wenn das Wetter schön ist.",
            "Könntest du bitte das Fenster schließen, es ist kalt hier."]),
        ("italian", "Italian", [
            "Il treno per {city} parte alle nove del mattino.",
            "Mia sorella {name} ha comprato una bicicletta nuova la settimana scorsa.",
            "Andiamo al mare se il tempo è bello.",
            "Potresti chiudere la finestra, per favore? Fa freddo qui."]),
        ("portuguese", "Portuguese", [
            "O comboio para {city} parte às nove da manhã.",
            "A minha irmã {name} comprou uma bicicleta nova na semana passada.",
            "Vamos à praia se o tempo estiver bom.",
            "Podes fechar a janela, por favor? Está frio aqui."]),
        ("dutch", "Dutch", [
            "De trein naar {city} vertrekt om negen uur 's ochtends.",
            "Mijn zus {name} heeft vorige week een nieuwe fiets gekocht.",
            "We gaan naar het strand als het mooi weer is.",
            "Kun je alsjeblieft het raam dichtdoen, het is hier koud."]),
    ], None, None, [], ("doc_id", "sender", {"source": ["sms", "email", "chat"]}, "text"),
       "language", False),
    _d("news", "article", "topic", "What is the topic of this news article?", _ABOUT, _NOT_ABOUT, [
        ("sports", "sports, matches and athletes", [
            "The home team won the championship final 3-1 on {date}.",
            "The striker scored twice as {city} beat their rivals.",
            "The tennis star reached the semi-finals after a five-set match.",
            "The marathon in {city} drew more than {num} runners."]),
        ("politics", "government, elections and lawmakers", [
            "Parliament passed the new budget bill after a long debate.",
            "The prime minister announced early elections for next spring.",
            "Voters in {city} go to the polls on {date} to choose a new mayor.",
            "The opposition party called for a vote of no confidence."]),
        ("technology", "gadgets, software and tech companies", [
            "The company unveiled a new smartphone with a foldable screen.",
            "A popular messaging app rolled out end-to-end encryption for all users.",
            "The chipmaker revealed a faster processor for laptops.",
            "Developers released a major update to the open-source operating system."]),
        ("business", "companies, markets and the economy", [
            "Shares of the retailer fell eight percent after weak quarterly earnings.",
            "The two banks agreed to merge in a deal worth billions.",
            "The central bank kept interest rates unchanged on {date}.",
            "The airline reported record profits for the second quarter."]),
        ("science", "research, space and discoveries", [
            "Astronomers discovered a new planet orbiting a nearby star.",
            "Researchers found a new species of frog in the rainforest.",
            "The space agency launched a probe to study the surface of Mars.",
            "Physicists measured the particle's mass with record precision."]),
        ("health", "medicine, diseases and public health", [
            "Health officials reported a rise in flu cases across {city}.",
            "A new study links regular walking to lower blood pressure.",
            "The hospital opened a new ward for cancer patients.",
            "Doctors recommend the updated vaccine for people over sixty."]),
        ("entertainment", "films, music and celebrities", [
            "The director's new film topped the box office this weekend.",
            "The pop singer announced a world tour starting in {city}.",
            "The hit series was renewed for a fourth season.",
            "The actor won best actor at the film festival."]),
        ("weather", "forecasts, storms and temperatures", [
            "Forecasters expect heavy snow in {city} over the weekend.",
            "A heatwave pushed temperatures above forty degrees.",
            "The storm brought strong winds and flooding to the coast.",
            "Light rain is expected on {date} with clearer skies later."]),
    ], None, None,
       ["More details are expected later today.", "The report was published this morning.",
        "Officials did not respond to requests for comment.",
        "The story was widely shared online.", "Reporters were at the scene.",
        "This article will be updated."],
       ("article_id", "reporter", {"section": ["front page", "online", "wire"]}, "body"),
       "news", False),
    _d("triage", "case", "department", "Which department should see this patient?",
       "is about {desc}", "is not about {desc}", [
        ("cardiology", "heart problems and chest pain", [
            "The patient reports chest pain spreading to the left arm.",
            "{name} says their heart is racing and beating irregularly.",
            "The patient has a history of heart attacks and feels pressure in the chest.",
            "An ECG earlier showed an abnormal heart rhythm."]),
        ("orthopedics", "bones, joints and fractures", [
            "{name} fell from a ladder and the wrist looks broken.",
            "The patient twisted a knee playing football and cannot bend it.",
            "An X-ray shows a fractured ankle.",
            "The patient has a dislocated shoulder after a fall."]),
        ("dermatology", "skin rashes and lesions", [
            "The patient has an itchy red rash on both arms.",
            "{name} noticed a mole that has changed colour and shape.",
            "There is a spreading skin rash with small blisters.",
            "The patient has patches of dry, scaly skin on the elbows."]),
        ("neurology", "headaches, seizures and nerve problems", [
            "The patient had a seizure this morning.",
            "{name} reports numbness on one side of the face and blurred speech.",
            "The patient has had migraines with flashing lights for a week.",
            "There is tingling and weakness in both legs."]),
        ("pediatrics", "care for babies and children", [
            "A two-year-old child keeps pulling at her ear and crying.",
            "The baby, six months old, is refusing to feed.",
            "A four-year-old boy has an ear infection.",
            "The parents brought in their toddler with a persistent cough."]),
        ("gastroenterology", "stomach, bowel and digestion problems", [
            "The patient has had stomach cramps and diarrhoea for three days.",
            "{name} reports heartburn after every meal.",
            "The patient has been vomiting and has pain in the lower abdomen.",
            "There is blood in the stool according to the patient."]),
    ], ("severity", ["Routine", "Urgent", "Emergency"], [
        ["The symptoms are mild and the patient is comfortable.",
         "The patient is stable and can wait for a regular appointment."],
        ["The symptoms are getting worse and the patient should be seen today.",
         "The pain is significant and needs attention within hours."],
        ["The patient is unconscious and barely breathing!",
         "The patient is losing a lot of blood and needs help immediately!"]]),
       ("mentions that the patient has a fever", "does not mention that the patient has a fever",
        ["The patient also has a high temperature.", "A fever of 39 degrees was measured."],
        ["Their temperature is normal.", "No fever was measured."]),
       ["The patient arrived with a family member.", "Insurance details were collected.",
        "The patient takes no regular medication.", "The waiting room is busy today.",
        "Vital signs will be repeated later.", "The patient speaks English well."],
       ("case_id", "patient", {"arrival": ["walk-in", "referral", "phone"]}, "notes"),
       "medical"),
    _d("insurance", "claim", "claim type", "What type of insurance claim is this?",
       _ABOUT, _NOT_ABOUT, [
        ("auto", "car accidents and vehicle damage", [
            "My car was rear-ended at a traffic light in {city}.",
            "Another driver scraped the side of my car in a parking lot.",
            "I hit a deer on the highway and the bumper is destroyed.",
            "My windshield cracked after a truck threw up a stone."]),
        ("home", "damage to a house or apartment", [
            "A burst pipe flooded my kitchen on {date}.",
            "A storm tore several tiles off my roof.",
            "There was a small fire in my living room that damaged the walls.",
            "A tree fell on our garage during the night."]),
        ("travel", "trip cancellations and lost luggage", [
            "My flight was cancelled and I lost the hotel booking in {city}.",
            "The airline lost my suitcase on the way to {city}.",
            "I had to cancel my holiday because my mother fell ill.",
            "My luggage arrived three days late and I had to buy clothes."]),
        ("health", "medical bills and treatments", [
            "I need reimbursement for my physiotherapy sessions.",
            "Please cover the hospital bill from my surgery on {date}.",
            "I am claiming the cost of my new prescription glasses.",
            "This claim is for the dental treatment I had last month."]),
        ("theft", "stolen belongings", [
            "My bicycle was stolen from outside the station.",
            "Someone broke into my flat and took my laptop and jewellery.",
            "My phone was stolen on the tram in {city}.",
            "Thieves took the tools from my locked shed."]),
        ("pet", "veterinary costs for insured pets", [
            "My dog needed surgery after swallowing a sock.",
            "I'm claiming the vet bill for my cat's dental cleaning.",
            "Our rabbit needed treatment for an eye infection.",
            "The vet treated my cat for a kidney infection."]),
    ], ("claim size", ["Small", "Medium", "Large"], [
        ["The total cost is under a hundred dollars.", "It is only a small amount, about {small}."],
        ["The repair estimate is around two thousand dollars.",
         "The costs come to a few thousand dollars."],
        ["The damage is estimated at over eighty thousand dollars.",
         "The total loss is more than a hundred thousand dollars."]]),
       ("mentions that someone was injured", "does not mention that anyone was injured",
        ["I hurt my neck and had to see a doctor.",
         "My passenger was injured and taken to hospital."],
        ["Luckily nobody was hurt.", "No one was injured."]),
       ["My policy number is on file.", "I have been insured with you for years.",
        "I attached photos to this form.", "Please let me know what else you need.",
        "I can be reached by phone in the evenings.", "I reported it as soon as I could."],
       ("claim_id", "policyholder", {"policy": ["basic", "standard", "premium"]}, "description"),
       "service", False),
    _d("it_incident", "incident", "incident category", "What kind of IT incident is this?",
       _ABOUT, _NOT_ABOUT, [
        ("network", "connectivity, wifi and VPN outages", [
            "The office wifi keeps dropping every few minutes.",
            "My computer cannot reach the internet.",
            "The VPN disconnects as soon as I connect from home.",
            "The network switch in room {num} has all lights off."]),
        ("hardware", "broken laptops, monitors and printers", [
            "My laptop screen has a crack and flickers.",
            "The printer on floor two is jammed and showing a hardware error.",
            "My keyboard stopped working after I spilled coffee on it.",
            "The monitor will not turn on anymore."]),
        ("access", "passwords, permissions and locked accounts", [
            "My account is locked after too many login attempts.",
            "I need access to the finance shared drive.",
            "{name} needs permissions to the project repository.",
            "My password expired and the reset link does not work."]),
        ("email", "mail delivery and mailbox problems", [
            "Emails from clients are not arriving in my inbox.",
            "My mailbox is full and I cannot send messages.",
            "Outgoing emails bounce back with a delivery error.",
            "The shared mailbox for support disappeared from my mail client."]),
        ("security", "malware, phishing and suspicious activity", [
            "I clicked a link in a strange email and now pop-ups appear everywhere.",
            "The antivirus found malware on my computer.",
            "There were login attempts to my account from another country.",
            "My browser homepage was changed to a strange search site."]),
        ("software", "application installs and errors", [
            "I need the statistics package installed on my machine.",
            "The accounting application shows an error when it starts.",
            "The spreadsheet program closes whenever I open large files.",
            "Please update the design software to the latest version."]),
    ], ("priority", ["P4", "P3", "P2", "P1"], [
        ["It only affects me and there is an easy workaround.",
         "It is a minor annoyance, no hurry."],
        ["It slows down my work but I can still continue.",
         "It affects a couple of people in my team."],
        ["The whole department cannot work until this is fixed.",
         "A key system for one team is unavailable."],
        ["The entire company is affected and production is down!",
         "All customers are impacted right now, this is a major outage!"]]),
       ("mentions that the problem started after an update",
        "does not mention that the problem started after an update",
        ["It started right after last night's update.",
         "The problem began after the latest patch was installed."],
        ["No updates were installed recently.", "Nothing was changed or updated before this."]),
       ["I am working from the main office today.", "My machine is the standard company laptop.",
        "I restarted once already.", "My manager is aware.",
        "I can share my screen if needed.", "My desk is near the kitchen."],
       ("incident_id", "reporter", {"source": ["portal", "phone", "email"]}, "summary"),
       "service"),
    _d("hr", "request", "request type", "What kind of HR request is this?", _ABOUT, _NOT_ABOUT, [
        ("leave", "vacation and time off", [
            "I would like to take vacation from {date} for two weeks.",
            "Can I take next Friday off for a family event?",
            "I'm requesting parental leave starting next month.",
            "I need three days of leave to move house."]),
        ("payroll", "salary payments and payslips", [
            "My salary for last month has not arrived.",
            "My payslip shows the wrong tax rate.",
            "I was paid {amount} less than usual this month.",
            "My overtime hours are missing from my pay."]),
        ("benefits", "health plans, pensions and perks", [
            "How do I add my spouse to the company health plan?",
            "I want to increase my pension contributions.",
            "Is the gym membership still covered as a perk?",
            "I have a question about my dental coverage."]),
        ("complaint", "workplace conflicts and misconduct", [
            "A colleague keeps shouting at me in front of the team.",
            "I want to report a colleague who made inappropriate comments.",
            "I feel I am being treated unfairly by a colleague in another team.",
            "There is ongoing bullying in our department."]),
        ("training", "courses and professional development", [
            "Can the company pay for a project management course?",
            "I'd like to attend the data analysis workshop next month.",
            "Is there budget for a language course this year?",
            "I want to sign up for the leadership training programme."]),
        ("resignation", "leaving the company", [
            "I am writing to hand in my notice.",
            "I have decided to resign, my last day will be {date}.",
            "I accepted an offer elsewhere and will be leaving the company.",
            "Please consider this my formal resignation."]),
    ], None,
       ("mentions the employee's manager", "does not mention the employee's manager",
        ["My manager {name2} is in copy.", "I already told my manager about this."],
        ["I have not spoken to my manager about it.", "My manager is not involved in this."]),
       ["I work in the main office.", "I joined the company a few years ago.",
        "I am on the marketing team.", "Thank you for your help.",
        "I can come by your office if easier.", "My employee number is in my signature."],
       ("request_id", "employee", {"department": ["sales", "finance", "engineering"]}, "message"),
       "work"),
    _d("travel", "request", "booking type", "What kind of booking is this?", _ABOUT, _NOT_ABOUT, [
        ("flight", "plane tickets", [
            "I want to book a return flight to {city} on {date}.",
            "Please find me a one-way plane ticket to {city}.",
            "I need a seat on the earliest flight to {city}.",
            "Book two tickets for the flight to {city}."]),
        ("hotel", "hotel rooms", [
            "I need a hotel room in {city} for three nights.",
            "Please reserve a double room near the centre of {city}.",
            "Book me a room with a sea view from {date}.",
            "I'm looking for a quiet hotel in {city} for the weekend."]),
        ("car_rental", "renting a car", [
            "I want to rent a car when I land in {city}.",
            "Please book a compact rental car for a week.",
            "I need a rental van to pick up at the airport.",
            "Can you reserve an automatic car for my trip to {city}?"]),
        ("train", "rail tickets", [
            "I need a train ticket to {city} on {date}.",
            "Please book a seat on the night train.",
            "Book me a rail pass for travelling around the country.",
            "I want a seat reservation on the express train to {city}."]),
        ("cruise", "cruises and ferries", [
            "We'd like to book a seven-night Mediterranean cruise.",
            "Please reserve a cabin on the ferry to the islands.",
            "I want a cruise with an ocean-view cabin.",
            "Book a river cruise for two in the spring."]),
        ("tour", "guided tours and excursions", [
            "I want a guided walking tour of the old town.",
            "Please book a day trip to the vineyards near {city}.",
            "Can I join a guided museum tour on {date}?",
            "Book a boat excursion to see the dolphins."]),
    ], ("budget", ["Budget", "Mid-range", "Luxury"], [
        ["I want the cheapest option possible.", "Keep it as low-cost as you can."],
        ["Something moderately priced is fine.", "A standard, mid-priced option works."],
        ["Money is no object, I want the most luxurious option.",
         "Only the top, premium first-class experience will do."]]),
       ("mentions travelling with children", "does not mention travelling with children",
        ["I will be travelling with my two kids.", "My young son is coming with me."],
        ["No children will be travelling.", "There are no kids in our group."]),
       ["I have a loyalty card with you.", "I booked with you before.",
        "Please send confirmation by email.", "I prefer to pay by card.",
        "My passport is valid for years.", "Let me know if anything is unclear."],
       ("booking_id", "traveller", {"channel": ["app", "web", "agent"]}, "request"),
       "hospitality"),
    _d("restaurant", "feedback", "aspect", "Which aspect of the restaurant is this feedback about?",
       _ABOUT, _NOT_ABOUT, [
        ("food", "taste and quality of the dishes", [
            "The pasta was overcooked and the sauce tasted of nothing.",
            "The steak was cooked exactly as I asked.",
            "The soup was cold and too salty.",
            "Every dish we ordered was full of flavour."]),
        ("service", "waiters and staff attitude", [
            "Our waiter {name} was rude and ignored us.",
            "The staff were very attentive and friendly.",
            "Nobody came to take our order for a long while.",
            "The server was polite and explained the menu well."]),
        ("price", "cost and value for money", [
            "It cost {amount} for two small plates.",
            "The prices are far too high for what you get.",
            "The lunch menu is really good value for money.",
            "The bill was much higher than the menu suggested."]),
        ("cleanliness", "hygiene of tables and restrooms", [
            "The tables were sticky and the floor was dirty.",
            "The restrooms were spotless.",
            "There was a hair in the cutlery basket and dust everywhere.",
            "Everything looked freshly cleaned."]),
        ("ambience", "decor, music and atmosphere", [
            "The music was so loud we could not talk.",
            "The candles and decor made it cosy.",
            "The lighting was harsh and the room felt cold.",
            "The terrace has a lovely view over {city}."]),
        ("wait_time", "how long it took to be seated and served", [
            "We waited an hour for our main course.",
            "We were seated immediately and food arrived quickly.",
            "It took forty minutes just to get a table.",
            "Our order came out in under ten minutes."]),
    ], ("rating", ["1 star", "2 stars", "3 stars", "4 stars", "5 stars"], [
        ["Overall a horrible visit, never again.",
         "Overall it was a disaster from start to finish."],
        ["Overall a poor experience.", "Overall I left fairly unhappy."],
        ["Overall it was average.", "Overall nothing memorable either way."],
        ["Overall a good visit.", "Overall we enjoyed it."],
        ["Overall an outstanding, perfect evening!",
         "Overall the best meal I have had in years!"]]),
       ("mentions a special occasion", "does not mention a special occasion",
        ["We were there to celebrate my birthday.", "It was our wedding anniversary dinner."],
        ["It was just an ordinary weeknight dinner.", "There was no special occasion."]),
       ["We were a group of four.", "We went on a weeknight.", "We had booked in advance.",
        "We sat near the window.", "It was my first visit.", "We ordered starters and mains."],
       ("feedback_id", "guest", {"visit": ["lunch", "dinner", "brunch"]}, "comment"),
       "hospitality"),
    _d("email", "email", "category", "Which category does this email belong to?",
       "is {desc}", "is not {desc}", [
        ("spam", "unsolicited bulk advertising", [
            "Huge sale! Buy three get one free on all vitamins, shop now!",
            "Congratulations, you have been selected for an exclusive deal on watches!",
            "Lose ten kilos in ten days with this miracle tea, order today!",
            "Cheap flights cheap hotels cheap everything, click to see!"]),
        ("phishing", "a fake message trying to steal login details or money", [
            "Your bank account is suspended, log in here to verify your password.",
            "We detected unusual activity, confirm your card number at this link.",
            "Your mailbox will be deleted today unless you re-enter your password.",
            "The tax office owes you a refund, send your bank details to claim it."]),
        ("newsletter", "a regular subscribed update from an organisation", [
            "Here is our monthly newsletter with this month's articles.",
            "Welcome to the weekly digest from the gardening club.",
            "In this issue: new recipes, member stories and upcoming events.",
            "Thanks for subscribing, here are this week's top stories."]),
        ("personal", "a message from a friend or family member", [
            "Hi, it's {name}, are we still on for dinner on Saturday?",
            "Mum says hi and wants to know when you're visiting.",
            "Happy birthday! Hope you have a wonderful day, love {name}.",
            "Here are the photos from our hike last weekend."]),
        ("work", "a message from a colleague about a job task", [
            "Please review the quarterly report before the meeting on {date}.",
            "The client wants the draft proposal by Friday.",
            "Can you update the slides for tomorrow's team meeting?",
            "I've assigned the new ticket to you, let me know if you need help."]),
        ("receipt", "an order confirmation or receipt", [
            "Thank you for your order {order}, your total was {amount}.",
            "This is your receipt for the purchase made on {date}.",
            "Your payment of {amount} has been received.",
            "Order confirmed: your items will ship soon."]),
    ], None, None,
       ["Sent from my phone.", "Please do not reply to this address.",
        "Have a nice day.", "Best regards.", "There is an attachment.",
        "This email was sent in the morning."],
       ("email_id", "sender", {"folder": ["inbox", "promotions", "updates"]}, "body"),
       "messages", False),
    _d("bank", "transaction", "spending category", "Which category does this transaction fall in?",
       _ABOUT, _NOT_ABOUT, [
        ("groceries", "supermarket and food shopping", [
            "Card payment at FreshMart supermarket.",
            "Weekly shop at the grocery store.",
            "Payment to the farmers market for vegetables and bread.",
            "Debit at GreenGrocer foods."]),
        ("fuel", "petrol and charging", [
            "Payment at the Shell petrol station.",
            "Fuel purchase on the motorway.",
            "Electric car charging session.",
            "Diesel fill-up at the gas station in {city}."]),
        ("rent", "monthly rent and housing payments", [
            "Standing order for monthly rent to the landlord.",
            "Transfer to the letting agency for the flat rent.",
            "Rent payment for the apartment in {city}.",
            "Monthly housing payment to {name}, landlord."]),
        ("dining", "restaurants, cafés and takeaway", [
            "Card payment at Luigi's Pizzeria.",
            "Coffee and croissant at the corner café.",
            "Takeaway sushi order.",
            "Dinner at the Thai restaurant in {city}."]),
        ("utilities", "electricity, water, internet and phone bills", [
            "Direct debit to the electricity company.",
            "Monthly water bill payment.",
            "Internet provider subscription.",
            "Mobile phone bill for this month."]),
        ("transport", "public transport and taxis", [
            "Metro travel card top-up.",
            "Taxi ride across {city}.",
            "Monthly bus pass purchase.",
            "Train ticket bought at the station machine."]),
    ], ("amount band", ["Small", "Medium", "Large"], [
        ["The amount is tiny, just a few dollars.", "It is a small charge, {small}."],
        ["It is a moderate amount, a few hundred dollars.",
         "It is a mid-sized charge of about 300 dollars."],
        ["It is a very large payment of several thousand dollars.",
         "It is a big charge, over 5,000 dollars."]]),
       ("mentions that the payment was made abroad",
        "does not mention that the payment was made abroad",
        ["The payment was made abroad in a foreign currency.",
         "It was charged while travelling overseas."],
        ["It was a domestic payment.", "The payment was made in the home country."]),
       ["The account is a current account.", "The statement covers last month.",
        "The card used is a debit card.", "Online banking was used to check this.",
        "The balance remains positive.", "This is one of many entries."],
       ("transaction_id", "account_holder", {"method": ["card", "transfer", "direct debit"]},
        "description"),
       "service"),
    _d("shipping", "update", "shipment status", "What is the status of this shipment?",
       "says the parcel is {desc}", "does not say the parcel is {desc}", [
        ("label_created", "registered but not yet picked up", [
            "The shipping label for order {order} was created, awaiting pickup.",
            "The sender has registered the parcel but not handed it over yet.",
            "Shipment information received, the parcel is not with us yet.",
            "A label was printed on {date}, waiting for the courier to collect it."]),
        ("in_transit", "on its way between depots", [
            "Your parcel left the sorting centre in {city} and is on its way.",
            "The shipment is travelling between hubs.",
            "Package {order} is in transit to the next facility.",
            "Your parcel is on a truck heading to the regional depot."]),
        ("out_for_delivery", "with the driver for delivery today", [
            "Your parcel is out for delivery today.",
            "The driver has your package and will arrive this afternoon.",
            "Package {order} is on the delivery van for today.",
            "Expect your parcel today, it is with the courier now."]),
        ("delivered", "delivered to the recipient", [
            "Your parcel was handed to {name}.",
            "The package was left at your front door.",
            "Package {order} was delivered on {date}.",
            "Delivered to your mailbox this morning."]),
        ("delayed", "late because of a problem", [
            "Your parcel is delayed due to bad weather.",
            "Delivery is postponed because of a backlog at the depot.",
            "Package {order} will arrive later than planned.",
            "There is a delay on your shipment, we apologise."]),
        ("returned", "being sent back to the sender", [
            "The parcel is being returned to the sender.",
            "Delivery failed three times so the package goes back to the shop.",
            "Package {order} was refused and is on its way back to the sender.",
            "The address was invalid, the parcel is returning to the sender."]),
    ], None,
       ("mentions that a signature is required", "does not mention that a signature is required",
        ["A signature is required on delivery.", "Someone must sign for this parcel."],
        ["No signature is needed.", "The parcel can be left without a signature."]),
       ["Thank you for shipping with us.", "Track your parcel online anytime.",
        "Our customer service is open on weekdays.", "This is an automated message.",
        "The sender is an online shop.", "The parcel weighs under five kilos."],
       ("tracking_id", "recipient", {"carrier": ["ParcelGo", "ShipFast", "PostExpress"]},
        "update"), "service"),
    _d("jobs", "application", "role", "Which role is this person applying for?",
     _ABOUT, _NOT_ABOUT, [
        ("software_engineer", "writing and maintaining software", [
            "I am applying for the backend developer position.",
            "I'd like to join your team as a software engineer.",
            "I write Python and Go and want to build your platform.",
            "Please consider me for the full-stack engineering role."]),
        ("nurse", "patient care in a hospital", [
            "I am applying for the registered nurse position on the surgical ward.",
            "I want to work as a nurse in your clinic.",
            "I have cared for patients on night shifts and seek a nursing post.",
            "Please consider my application for the paediatric nurse vacancy."]),
        ("teacher", "teaching pupils at a school", [
            "I am applying to teach maths at your secondary school.",
            "I would love to be a primary school teacher at your academy.",
            "I want the English teacher vacancy for next term.",
            "Please consider me for the science teaching post."]),
        ("accountant", "bookkeeping, taxes and financial reports", [
            "I am applying for the accountant role in your finance team.",
            "I'd like to handle bookkeeping and tax returns for your firm.",
            "Please consider me for the audit and accounting position.",
            "I prepare financial statements and want your accountant job."]),
        ("chef", "cooking in a restaurant kitchen", [
            "I am applying for the head chef position.",
            "I want to work as a line cook in your kitchen.",
            "Please consider me for the pastry chef vacancy.",
            "I'd like to run the kitchen of your new restaurant."]),
        ("designer", "visual and graphic design", [
            "I am applying for the graphic designer role.",
            "I design logos and brand identities and want to join your studio.",
            "Please consider me for the UX designer position.",
            "My portfolio shows the posters and websites I designed."]),
    ], ("seniority", ["Junior", "Mid-level", "Senior"], [
        ["I just graduated and this would be my first job.",
         "I have less than one year of experience."],
        ["I have about four years of experience in the field.",
         "I have worked in similar roles for a few years."],
        ["I have over fifteen years of experience and have led large teams.",
         "I have spent two decades in the field, most of it leading departments."]]),
       ("mentions that the candidate would need to relocate",
        "does not mention that the candidate would need to relocate",
        ["I would need to relocate from {city} for this job.", "I'm ready to move to your city."],
        ["I already live nearby.", "No relocation would be needed."]),
       ["My CV is attached.", "I look forward to hearing from you.",
        "I found the advert on your website.", "I am available for an interview.",
        "Thank you for your time.", "My references are available on request."],
       ("application_id", "candidate", {"source": ["website", "referral", "job board"]},
        "cover_letter"), "work"),
    _d("realestate", "listing", "property type", "What type of property is listed?",
       _ABOUT, _NOT_ABOUT, [
        ("apartment", "a flat in a multi-unit building", [
            "Bright two-bedroom apartment on the fourth floor with a lift.",
            "Flat in a modern building close to the centre of {city}.",
            "Studio apartment in a block with a shared courtyard.",
            "Third-floor flat with a balcony overlooking the street."]),
        ("house", "a detached or semi-detached family house", [
            "Detached family house with a large garden and a shed.",
            "Semi-detached house with three bedrooms on a quiet street.",
            "Two-storey house on a quiet lane in {city}.",
            "Spacious family home with a back yard and a shed."]),
        ("land", "an empty building plot", [
            "Empty building plot with planning permission.",
            "Flat plot of land ready for construction.",
            "Half a hectare of land on the edge of {city}, no buildings.",
            "Vacant lot with water and power connections at the boundary."]),
        ("office", "commercial office space", [
            "Open-plan office space for twenty desks.",
            "Office suite with meeting rooms in a business park.",
            "Commercial office floor in the financial district of {city}.",
            "Serviced office with reception and kitchen."]),
        ("shop", "a retail unit", [
            "Retail unit with a large shop window on the high street.",
            "Ground-floor shop suitable for a boutique.",
            "Corner shop premises with storage at the back.",
            "Retail space in a busy shopping arcade."]),
        ("farm", "agricultural property with farmland", [
            "Working farm with barns and forty hectares of pasture.",
            "Farmhouse with fields, stables and a tractor shed.",
            "Dairy farm with milking parlour and grazing land.",
            "Vineyard estate with farmland and outbuildings."]),
    ], ("price band", ["Low", "Medium", "High"], [
        ["Priced well below the local average, a real bargain.", "Very affordable asking price."],
        ["The asking price is around the local average.", "Priced in line with the market."],
        ["A premium property with a multi-million asking price.",
         "Priced at the very top of the market."]]),
       ("mentions parking", "does not mention parking",
        ["Includes a private parking space.", "Parking for two cars is included."],
        ["There is no parking.", "No parking space comes with it."]),
       ["Viewings can be arranged.", "The listing was updated recently.",
        "Photos are available online.", "Contact the agent for details.",
        "The energy certificate is available.", "Council taxes apply."],
       ("listing_id", "agent", {"status": ["new", "reduced", "available"]}, "description"),
       "property"),
    # held-out domains
    _d("legal", "matter", "area of law", "Which area of law does this matter fall under?",
       _ABOUT, _NOT_ABOUT, [
        ("family_law", "divorce, custody and child support", [
            "My wife and I are divorcing and cannot agree on custody.",
            "I want to change the child support arrangement with my ex.",
            "We need help with a prenuptial agreement before the wedding.",
            "My ex-husband will not let me see the children."]),
        ("employment_law", "dismissal, contracts and workplace rights", [
            "I was fired without notice after ten years.",
            "My employer refuses to pay my final wages.",
            "My contract was changed without my agreement.",
            "I was dismissed after telling my boss I was pregnant."]),
        ("criminal_law", "arrests and criminal charges", [
            "My son was arrested for shoplifting in {city}.",
            "I have been charged with drunk driving.",
            "The police want to question me about a robbery.",
            "I was accused of assault after a bar fight."]),
        ("property_law", "landlords, tenancies and property disputes", [
            "My landlord will not return my deposit.",
            "My neighbour built a fence on my land.",
            "The landlord wants to evict me with one week's notice.",
            "There is a dispute over the boundary of our garden."]),
        ("immigration_law", "visas, residency and citizenship", [
            "My work visa expires on {date} and I need to renew it.",
            "I want to apply for citizenship after living here for years.",
            "My partner's residence permit was refused.",
            "I need advice on bringing my parents here on a family visa."]),
        ("contract_law", "business agreements and breaches of contract", [
            "A supplier broke our contract and did not deliver.",
            "The builder was paid but never finished the job.",
            "I want to check a partnership agreement before signing.",
            "A client refuses to pay the {amount} agreed in our contract."]),
    ], ("urgency", ["Low", "Medium", "High"], [
        ["There is no deadline, I just want general advice.", "This can wait a few months."],
        ["I need to act within the next few weeks.", "There is a deadline next month."],
        ["The deadline to file is tomorrow morning!", "I must respond by the end of today!"]]),
       ("mentions that a court date is set", "does not mention that a court date is set",
        ["A court date has already been set.", "The hearing is scheduled at the district court."],
        ["Nothing has gone to court yet.", "There is no court date."]),
       ["I found your firm online.", "I can send documents.", "I live in the area.",
        "I have not hired a lawyer before.", "Please call me back.",
         "I can pay a consultation fee."],
       ("matter_id", "client", {"intake": ["phone", "web", "walk-in"]}, "summary"),
       ("legal", "work", "service")),
    _d("veterinary", "visit", "reason for visit", "Why is this pet being brought in?",
       _ABOUT, _NOT_ABOUT, [
        ("vaccination", "routine shots and boosters", [
            "My puppy is due for her first vaccinations.",
            "The cat needs its yearly booster shot.",
            "I'd like to get my dog's rabies vaccine updated.",
            "Our kitten needs the second round of vaccines."]),
        ("injury", "wounds, limping and accidents", [
            "My dog is limping after jumping off the sofa.",
            "The cat came home with a deep cut on its paw.",
            "Our dog was hit by a bike and has a scraped leg.",
            "My rabbit hurt its leg in the hutch."]),
        ("digestive", "vomiting, diarrhoea and appetite problems", [
            "My dog has been vomiting since yesterday.",
            "The cat has diarrhoea and won't eat.",
            "Our puppy ate something from the bin and has an upset stomach.",
            "My dog keeps throwing up after meals."]),
        ("dental", "teeth and gum problems", [
            "My cat has bad breath and red gums.",
            "The dog has a broken tooth.",
            "I think my old dog needs a teeth cleaning.",
            "Our cat drops food because chewing seems painful."]),
        ("skin", "itching, fleas and fur loss", [
            "My dog scratches all the time and has bald patches.",
            "The cat has fleas and scabs on its neck.",
            "There is a red itchy rash on my dog's belly.",
            "Our rabbit is losing fur in clumps."]),
        ("neutering", "spaying and castration", [
            "I want to book my male cat in to be neutered.",
            "Our dog needs to be spayed.",
            "When is the right age to castrate my puppy?",
            "I'd like to schedule spaying for my kitten."]),
    ], ("severity", ["Mild", "Moderate", "Severe"], [
        ["The pet is otherwise bright and playful.", "It seems minor, the pet is eating normally."],
        ["The pet is a bit lethargic and should be seen soon.",
         "It has been getting worse for a couple of days."],
        ["The pet collapsed and is struggling to breathe!",
         "The pet is bleeding heavily and not responding!"]]),
       ("mentions an earlier visit to this clinic",
        "does not mention an earlier visit to this clinic",
        ["We have been here before with this pet.", "The pet has visited your clinic before."],
        ["This is our first visit to your clinic.",
         "The pet has never been to this clinic."]),
       ["The pet is a rescue animal.", "The pet is microchipped.",
        "We can come in any afternoon.", "The pet is insured.",
        "The pet lives indoors mostly.", "We recently moved house."],
       ("visit_id", "owner", {"pet_age": ["young", "adult", "senior"]}, "notes"),
       ("pets", "medical", "service")),
    _d("education", "message", "school topic", "What is this message to the school about?",
       _ABOUT, _NOT_ABOUT, [
        ("absence", "a pupil missing school", [
            "{name} will be absent today because of a cold.",
            "My son will miss school on {date} for a dentist appointment.",
            "Our daughter is sick and won't come in this week.",
            "{name} has to stay home tomorrow for a family matter."]),
        ("grades", "marks, report cards and exam results", [
            "Why did {name} get a low mark on the maths exam?",
            "We have a question about the report card grades.",
            "Could you explain how the science project was graded?",
            "My daughter's history result seems lower than expected."]),
        ("bullying", "a pupil being picked on by others", [
            "{name} is being teased and pushed by older pupils every day.",
            "Some classmates are calling my son names online.",
            "My daughter is being excluded and mocked at break time.",
            "A group of pupils keeps taking {name}'s lunch."]),
        ("enrollment", "joining or changing school", [
            "We are moving to {city} and want to enrol our son.",
            "How do we register our daughter for next year?",
            "Is there a place for a new pupil in year three?",
            "We'd like to transfer {name} to your school."]),
        ("trips", "school outings and excursions", [
            "Is the museum trip on {date} still going ahead?",
            "How much does the class trip to the zoo cost?",
            "Do pupils need packed lunches for the outing?",
            "Can parents volunteer for the field trip?"]),
        ("homework", "assignments and study at home", [
            "{name} doesn't understand the homework on fractions.",
            "How much homework should pupils do each night?",
            "The essay assignment is due on {date}, is that right?",
            "The reading homework is too much for my son."]),
    ], None,
       ("mentions a teacher by role", "does not mention a teacher by role",
        ["The class teacher already knows.", "I spoke to the form teacher yesterday."],
        ["We have not talked to any teacher yet.", "No teacher has been told yet."]),
       ["Our family is new to the school.", "We live close by.",
        "Thank you for your time.", "I can come in if needed.",
        "My phone number is on file.", "This is from the parents' account."],
       ("message_id", "parent", {"year": ["year 1", "year 3", "year 6"]}, "text"),
       ("school", "work", "medical")),
    _d("video_games", "comment", "genre", "What genre of video game is this comment about?",
       _ABOUT, _NOT_ABOUT, [
        ("shooter", "first-person and third-person shooters", [
            "The sniper rifles in this shooter are way too strong.",
            "I love the headshots and gunfights in this first-person shooter.",
            "The new battle royale map has great spots for firefights.",
            "Reloading the assault rifle feels so satisfying."]),
        ("rpg", "role-playing games with quests and character levels", [
            "I spent hours levelling my mage and doing side quests.",
            "The character builds and skill trees in this RPG are deep.",
            "The main quest of this role-playing game has great dialogue choices.",
            "My party of adventurers finally beat the dragon dungeon."]),
        ("racing", "driving and racing games", [
            "The drifting in this racing game feels realistic.",
            "I finally beat the lap record on the mountain track.",
            "The car tuning options are great.",
            "Overtaking on the final corner never gets old."]),
        ("puzzle", "logic and puzzle games", [
            "Level 40 of this puzzle game took me an hour to solve.",
            "Matching the coloured tiles gets tricky later on.",
            "The logic puzzles really make you think.",
            "Sliding the blocks into place is relaxing."]),
        ("sports_game", "football, basketball and other sports games", [
            "The football game's new season has updated team rosters.",
            "My basketball team won the finals in career mode.",
            "The tennis controls in this sports game are smooth.",
            "Penalty kicks are too easy in this soccer game."]),
        ("strategy", "strategy and city-building games", [
            "Managing resources and armies in this strategy game is addictive.",
            "My city now has {num} citizens in this builder.",
            "The turn-based battles reward careful planning.",
            "I conquered the whole map with my empire."]),
    ], ("enjoyment", ["Hated it", "Mixed", "Loved it"], [
        ["Honestly I hated it and uninstalled.", "Awful experience, total waste of money."],
        ["Some parts are fun, others are frustrating.", "I have mixed feelings about it."],
        ["I absolutely love it, best game this year!", "Amazing, I can't stop playing!"]]),
       ("mentions playing online with friends", "does not mention playing online with friends",
        ["I play it online with my friends every night.", "My friends and I team up online."],
        ["I only play it alone offline.", "I never play it with friends."]),
       ["I play on a console.", "I bought it during a sale.", "The download was large.",
        "I've played for about twenty hours.", "The soundtrack is on repeat in my head.",
        "I play mostly on weekends."],
       ("comment_id", "player", {"platform": ["PC", "console", "handheld"]}, "comment"),
       ("games", "commerce")),
]

_GLOBAL_FILLERS = (
    "There is some background to this.", "It has been a busy few weeks.",
    "This was written in the evening.", "More information can be provided.",
    "The details below are in no particular order.", "Some of this may not matter.",
    "It is being shared for the record.", "Nothing else needs to be added here.",
    "Questions are welcome.", "Further notes may follow later.",
)
_NAMES = ("Ana", "Ben", "Chloé", "David", "Elif", "Farid", "Grace", "Hiro", "Ines", "Jonas",
          "Kemi", "Lucas", "Maya", "Nikolai", "Olivia", "Pedro", "Quinn", "Rosa", "Sam", "Tariq",
          "Uma", "Viktor", "Wen", "Yara", "Zoe")
_CITIES = ("Lisbon", "Lyon", "Madrid", "Berlin", "Rome", "Amsterdam", "Boston", "Toronto",
           "Dublin", "Vienna", "Oslo", "Porto", "Seville", "Munich", "Naples", "Utrecht")
_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August",
           "September", "October", "November", "December")

# Question wordings. The last quarter of each list is held out (never used in "train").
_CHOICE_WORDINGS = (
    "{ask}", "Which {attr} fits this {noun}?", "Classify the {noun} by {attr}.",
    "Pick the {attr} that best matches the {noun}.", "What is the {attr} of this {noun}?",
    "Choose the correct {attr} for the {noun}.",
    "Given the options, which {attr} applies to the {noun} above?",
    "Label this {noun} with its {attr}.",
)
_SCORE_WORDINGS = (
    "Rate the {attr} of this {noun}.", "What is the {attr} level of the {noun}?",
    "Which level best describes the {attr} of this {noun}?",
    "How would you grade the {attr} of this {noun}?",
    "Assess the {attr} expressed in the {noun}.", "Place the {noun} on the {attr} scale.",
    "On the given scale, where does this {noun} fall for {attr}?",
    "Judge the {attr} of the {noun} using the levels provided.",
)
# noul: indexes 0-3 state the claim, 4-7 its negation; 3 and 7 are held out.
_NOUL_FORMS = (
    "The {noun} {p}.", "Is it true that the {noun} {p}?", "True or false: the {noun} {p}.",
    "Yes or no: would you say the {noun} {p}?",
)
_HELD = {"choice": (6, 7), "score": (6, 7), "is": (3, 7), "fact": (3, 7)}
_COUNT = {"choice": len(_CHOICE_WORDINGS), "score": len(_SCORE_WORDINGS), "is": 8, "fact": 8}

_BY_NAME = {d["name"]: d for d in _DOMAINS}
TRAIN_DOMAINS: tuple[str, ...] = tuple(d["name"] for d in _DOMAINS[:16])
HELDOUT_DOMAINS: tuple[str, ...] = tuple(d["name"] for d in _DOMAINS[16:])
LAYOUTS = ("text", "json", "long")


def _families(domain: dict) -> set[str]:
    fam = domain["family"]
    return set(fam) if isinstance(fam, tuple) else {fam}


def heldout_templates() -> frozenset[str]:
    """Template ids reserved for the held-out split (a quarter of each kind, every domain)."""
    out = set()
    for d in _DOMAINS:
        for kind, idxs in _HELD.items():
            if kind == "score" and d["score"] is None or kind == "fact" and d["fact"] is None:
                continue
            out.update(f"{d['name']}.{kind}.{i}" for i in idxs)
    return frozenset(out)


def filler_sentences(domain: str) -> tuple[str, ...]:
    """The neutral filler sentences a long state of ``domain`` may use."""
    return tuple(_BY_NAME[domain]["fillers"]) + _GLOBAL_FILLERS


def _pick_index(rng: random.Random, kind: str, held: bool | None, forms=None) -> int:
    """A wording index; held=None allows any, True only held-out, False only train ones."""
    idxs = [i for i in range(_COUNT[kind]) if forms is None or i in forms]
    if held is not None:
        idxs = [i for i in idxs if (i in _HELD[kind]) == held]
    return rng.choice(idxs)


def _slots(rng: random.Random) -> dict:
    name, name2 = rng.sample(_NAMES, 2)
    return {"name": name, "name2": name2, "city": rng.choice(_CITIES),
            "date": f"{rng.choice(_MONTHS)} {rng.randint(1, 28)}",
            "amount": f"${rng.randint(12, 950)}.{rng.randint(0, 99):02d}",
            "small": f"{rng.randint(5, 60)} dollars", "num": str(rng.randint(3, 80)),
            "order": f"#{rng.randint(10000, 99999)}"}


def _option_count(rng: random.Random) -> int:
    r = rng.random()
    if r < 0.55:
        return rng.randint(2, 6)
    if r < 0.80:
        return rng.randint(7, 12)
    return rng.randint(13, 20)


def _choice(rng, d, gold, held) -> tuple[dict, str]:
    i = _pick_index(rng, "choice", held)
    text = _CHOICE_WORDINGS[i].format(ask=d["ask"], attr=d["attr"], noun=d["noun"])
    k = _option_count(rng)
    others = [c for c in d["cats"] if c[0] != gold[0]]
    rng.shuffle(others)
    opts = [gold] + others[:k - 1]
    if len(opts) < k:
        used = {c[0] for c in d["cats"]}
        fam = _families(d)
        pool = [c for o in map(_BY_NAME.get, TRAIN_DOMAINS)
                if o["pool"] and not fam & _families(o)
                for c in o["cats"] if c[0] not in used]
        rng.shuffle(pool)
        for c in pool:
            if len(opts) >= k:
                break
            if c[0] not in used:
                used.add(c[0])
                opts.append(c)
    rng.shuffle(opts)
    null = rng.random() < 0.3
    crit = {key: (None if null else desc) for key, desc, _ in opts}
    q = {"type": "choice", "instructions": text, "criteria": crit, "answer": gold[0]}
    return q, f"{d['name']}.choice.{i}"


def _score(rng, d, level, held) -> tuple[dict, str]:
    attr, levels, _ = d["score"]
    i = _pick_index(rng, "score", held)
    text = _SCORE_WORDINGS[i].format(attr=attr, noun=d["noun"])
    q = {"type": "score", "instructions": text, "criteria": list(levels),
         "answer": levels[level]}
    return q, f"{d['name']}.score.{i}"


def _noul(rng, d, kind, pos, neg, truth, held, form) -> tuple[dict, str]:
    """form: 'pos', 'neg' or None (either); truth: whether the positive claim holds."""
    allowed = {"pos": range(4), "neg": range(4, 8)}.get(form)
    i = _pick_index(rng, kind, held, allowed)
    claim = pos if i < 4 else neg
    text = _NOUL_FORMS[i % 4].format(noun=d["noun"], p=claim)
    gold = truth if i < 4 else not truth
    q = {"type": "noul", "instructions": text, "answer": "yes" if gold else "no"}
    return q, f"{d['name']}.{kind}.{i}"


def _noul_unit(rng, d, kind, pos, neg, truth, held) -> list[tuple[dict, str]]:
    """One yes/no question about a claim, or (a quarter of the time) the claim and its negation
    as a complementary pair in random order."""
    if rng.random() < 0.25:
        pair = [_noul(rng, d, kind, pos, neg, truth, held, "pos"),
                _noul(rng, d, kind, pos, neg, truth, held, "neg")]
        rng.shuffle(pair)
        return pair
    return [_noul(rng, d, kind, pos, neg, truth, held, None)]


def _cat_claims(d, cat) -> tuple[str, str]:
    key, desc, _ = cat
    fmt = {"desc": desc, "label": key.replace("_", " ")}
    return d["pred"].format(**fmt), d["neg"].format(**fmt)


def _build(rng: random.Random, d: dict, held: bool | None) -> Item:
    slots = _slots(rng)
    layout = rng.choices(LAYOUTS, weights=(55, 20, 25))[0]
    if layout == "long" and not d["fillers"]:
        layout = "text"
    cat = rng.choice(d["cats"])
    level = rng.randrange(len(d["score"][1])) if d["score"] else None
    fact = rng.random() < 0.5 if d["fact"] else None
    attrs = ["cat"]
    if layout == "long":
        attrs = [rng.choice(["cat"] + ["score"] * bool(d["score"]) + ["fact"] * bool(d["fact"]))]
    else:
        if d["score"] and rng.random() < 0.5:
            attrs.append("score")
        if d["fact"] is not None and rng.random() < 0.5:
            attrs.append("fact")
    sentences = []
    for a in attrs:
        if a == "cat":
            sentences.append(rng.choice(cat[2]))
        elif a == "score":
            sentences.append(rng.choice(d["score"][2][level]))
        else:
            sentences.append(rng.choice(d["fact"][2] if fact else d["fact"][3]))
    sentences = [s.format(**slots) for s in sentences]
    rng.shuffle(sentences)
    if layout == "long":
        n = rng.randint(8, 16)
        fill = rng.sample(filler_sentences(d["name"]), n - 1)
        idx = rng.randint(-(-n // 3), (2 * n + 2) // 3 - 1)
        state = " ".join(fill[:idx] + sentences + fill[idx:])
    elif layout == "json":
        id_field, who, extras, text_field = d["json"]
        state = {id_field: rng.randint(1000, 99999), who: slots["name"]}
        for key, values in extras.items():
            state[key] = rng.choice(values)
        state[text_field] = " ".join(sentences)
    else:
        state = " ".join(sentences)

    units = []  # each unit: list of (question, template id)
    if "cat" in attrs:
        units.append(lambda: [_choice(rng, d, cat, held)])

        def cat_noul():
            if rng.random() < 0.5:
                target, truth = cat, True
            else:
                target, truth = rng.choice([c for c in d["cats"] if c is not cat]), False
            return _noul_unit(rng, d, "is", *_cat_claims(d, target), truth, held)
        units.append(cat_noul)
    if "score" in attrs:
        units.append(lambda: [_score(rng, d, level, held)])
    if "fact" in attrs:
        units.append(lambda: _noul_unit(rng, d, "fact", d["fact"][0], d["fact"][1], fact, held))
    rng.shuffle(units)
    target = rng.randint(1, 4)
    qs: list[tuple[dict, str]] = []
    for unit in units:
        got = unit()
        if qs and len(qs) + len(got) > target:
            continue
        qs.extend(got[:4 - len(qs)])
        if len(qs) >= target:
            break
    questions = {f"q{j + 1}": q for j, (q, _) in enumerate(qs)}
    return Item({"state": state, "questions": questions}, d["name"], layout,
                tuple(t for _, t in qs))


def generate(split: str, n_states: int, seed: int = 0) -> list[Item]:
    """Generate ``n_states`` labelled states for ``split`` ("train" or "heldout").

    "train" uses only train domains and train templates; "heldout" mixes held-out domains
    (any template) with train domains asked only through held-out templates. Deterministic
    for a given (split, n_states, seed).
    """
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    rng = random.Random(f"distil_mix:{split}:{seed}")
    items = []
    for _ in range(n_states):
        if split == "train":
            items.append(_build(rng, _BY_NAME[rng.choice(TRAIN_DOMAINS)], False))
        elif rng.random() < 0.5:
            items.append(_build(rng, _BY_NAME[rng.choice(HELDOUT_DOMAINS)], None))
        else:
            items.append(_build(rng, _BY_NAME[rng.choice(TRAIN_DOMAINS)], True))
    return items


def summarize(items: list[Item]) -> str:
    """A one-line summary: states, questions per type, states per layout."""
    types = Counter(q["type"] for it in items for q in it.record["questions"].values())
    layouts = Counter(it.layout for it in items)
    return (f"{len(items)} states, {sum(types.values())} questions; types: "
            + ", ".join(f"{k}={types[k]}" for k in ("choice", "noul", "score"))
            + "; layouts: " + ", ".join(f"{k}={layouts[k]}" for k in LAYOUTS))


def write(items: list[Item], path: Path) -> Path:
    """The records to ``path`` (JSONL) and where each came from to its ``.meta.jsonl`` sidecar
    (``mix.jsonl`` -> ``mix.meta.jsonl``); returns the sidecar's path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = path.with_name(path.name.removesuffix(".jsonl") + ".meta.jsonl")
    with path.open("w", encoding="utf-8") as f, meta.open("w", encoding="utf-8") as m:
        for it in items:
            f.write(json.dumps(it.record, ensure_ascii=False) + "\n")
            m.write(json.dumps({"domain": it.domain, "layout": it.layout,
                                "templates": list(it.templates)}, ensure_ascii=False) + "\n")
    return meta


def main(argv=None) -> int:
    """CLI: write the mix as JSONL plus a FILE.meta.jsonl sidecar."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split", choices=("train", "heldout"), default="train")
    parser.add_argument("--states", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", required=True)
    args = parser.parse_args(argv)
    items = generate(args.split, args.states, args.seed)
    write(items, Path(args.output))
    print(summarize(items))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
